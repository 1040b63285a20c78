/* Datagram authentication (wire.h, bytes 24-55): AES-256-GMAC tags from OpenSSL's libcrypto: its
 * GCM mode (GHASH with carry-less multiplication) over AES-256 through EVP (AES-NI). Picked by
 * measurement on this project's 2-core machine, one core, per datagram of 1472 / 8192 / 65000
 * bytes: SipHash-2-4 22 / 23 / 23 Gbit/s, ChaCha20-Poly1305 19 / 61 / 73, AES-256-GMAC through
 * EVP's AEAD calls 53 / 109 / 134, and through CRYPTO_gcm128 as here ~90 / ~125 / ~140 (EVP's
 * per-call cost, ~150 ns, is most of a 1472-byte datagram's).
 * Used by the I/O thread only (one cipher context, not thread-safe). */
#ifndef P2P_AUTH_H
#define P2P_AUTH_H
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define AUTH_KEY 32

struct auth {
    void *aes;                    /* owned EVP_CIPHER_CTX: AES-256-ECB under the data key */
    void *gcm;                    /* owned GCM128_CONTEXT over it; NULL = tags off */
    uint32_t job;
    uint64_t session;             /* this engine's, random */
    uint32_t counter;             /* the next datagram's; a new session when it wraps */
};

/* 0, or a negative errno (no randomness, no memory, no cipher) with p2p_last_error set. */
int auth_init(struct auth *a, const uint8_t key[AUTH_KEY], uint32_t job);
void auth_free(struct auth *a);
/* Stamps the header (already filled by wire_put_hdr) with session, counter and job, and writes its
 * tag over the header and the body pieces. */
void auth_seal(struct auth *a, uint8_t *hdr, const struct iovec *body, int nbody);
/* 1 when the datagram is of this job and its tag is right (always 1 on the job when tags are off). */
int auth_check(struct auth *a, const uint8_t *dgram, size_t len);

#endif
