/* GHASH, GCM's hash over GF(2^128), with VPCLMULQDQ: 32 blocks per step, 4 to a 512-bit register
 * (AVX-512) or 2 to a 256-bit one (AVX2 CPUs with VPCLMULQDQ: AMD Zen 3, Intel Alder Lake and later).
 *
 * The datagram tags (auth.c) are GMAC: GHASH over everything a datagram carries, so their cost is
 * GHASH's per byte. OpenSSL 3.0's GCM128 hashes one 128-bit lane at a time (gcm_ghash_avx); where
 * the CPU has VPCLMULQDQ this does four (AVX-512) or two, with one reduction per 32 blocks (the
 * products of the blocks with H^32..H^1 are summed unreduced: the reduction is linear). The result is GHASH's,
 * bit for bit, so peers on CPUs with and without it agree on every tag (tests/transport/test_tags.py
 * checks it against OpenSSL's and against an independent AES-GCM).
 *
 * Blocks are held byte-reversed, as the multiply reads them (Gueron and Kounavis, "Intel
 * Carry-Less Multiplication Instruction and its Usage for Computing the GCM Mode", 2014).
 * Call nothing here unless ghash_fast_available(). Not thread-safe per state; a key is read-only.
 */
#ifndef P2P_GHASH_H
#define P2P_GHASH_H
#include <stddef.h>
#include <stdint.h>

#define GHASH_POWERS 32

struct ghash_key {
    uint8_t powers[GHASH_POWERS][16]; /* H^32 .. H^1, byte-reversed */
    int wide;                         /* whether the 512-bit loop runs (AVX-512), else the 256-bit one */
};

struct ghash_state {
    uint8_t y[16];                    /* the running hash, byte-reversed */
    uint8_t partial[16];              /* bytes of a block not complete yet */
    uint32_t npartial;
    uint64_t bytes;                   /* hashed so far (GCM's additional data) */
};

/* Whether this CPU (and OS) runs the VPCLMULQDQ code (AVX2 at least). */
int ghash_fast_available(void);
/* h: GCM's hash key, the block cipher's encryption of 16 zero bytes. */
void ghash_key_init(struct ghash_key *k, const uint8_t h[16]);
void ghash_start(struct ghash_state *s);
/* Hashes len more bytes of the additional data (the pieces of one stream, in order). */
void ghash_update(const struct ghash_key *k, struct ghash_state *s, const void *data, size_t len);
/* Pads the last block, hashes the lengths block (the additional data's bits, no ciphertext) and
 * writes GHASH's result, in GCM's byte order: the tag before it is XORed with E_K(J0). */
void ghash_finish(const struct ghash_key *k, struct ghash_state *s, uint8_t out[16]);

#endif
