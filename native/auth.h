/* Datagram authentication (wire.h, bytes 24-55): AES-256-GMAC tags. AES-256 from OpenSSL's
 * libcrypto through EVP (AES-NI); GHASH, where the CPU has AVX-512 VPCLMULQDQ, from ghash.c (four
 * blocks per instruction), else OpenSSL's GCM128 (one), the same tags either way. Picked by
 * measurement on this project's 2-core machine, one core, per datagram of 1472 / 8192 / 65000
 * bytes: SipHash-2-4 22 / 23 / 23 Gbit/s, ChaCha20-Poly1305 19 / 61 / 73, AES-256-GMAC through
 * EVP's AEAD calls 53 / 109 / 134, and through CRYPTO_gcm128 ~90 / ~125 / ~140 (EVP's per-call
 * cost, ~150 ns, is most of a 1472-byte datagram's); ghash.c: see tests/transport/test_tags.py.
 * P2P_PORTABLE_GHASH set in the environment keeps OpenSSL's GHASH (to compare).
 * Used by the I/O thread only (one cipher context, not thread-safe). */
#ifndef P2P_AUTH_H
#define P2P_AUTH_H
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define AUTH_KEY 32
#define AUTH_MAX_BODY 8               /* body pieces one tag covers */

/* One sequence of IVs. A receiver's replay window follows each (sender, session) in counter order,
 * so datagrams that reach it by different paths (its unicast socket, a multicast group's) and can
 * overtake one another there each take a stream of their own. */
struct auth_stream {
    uint64_t session;             /* random */
    uint32_t counter;             /* the next datagram's; a new session when it wraps */
};

/* Where a datagram goes: the tag covers it, so that a datagram is good at one receiver only (a
 * captured datagram replayed to another member fails there, whose replay window never saw it).
 * The sender takes the address and port it sends to; the receiver the address the datagram was
 * sent to (IP_PKTINFO: the IP header's destination, whichever of its addresses the sender used)
 * and the port of the socket it arrived on. That holds on loopback, across hosts without NAT
 * (peers reach each other at the addresses they registered), and for multicast, where the
 * destination is the group and the job's multicast port, the same at every member: one group
 * datagram is good at each member once (each has its own replay window), and at no member's
 * unicast socket. A peer that was sent to at another address (NAT between peers) refuses all. */
struct auth_dest {
    uint32_t addr;                /* IPv4, network order */
    uint16_t port;                /* host order */
};

struct ghash_key;

struct auth {
    void *aes;                    /* owned EVP_CIPHER_CTX: AES-256-ECB under the data key */
    void *gcm;                    /* owned GCM128_CONTEXT over it; NULL = tags off */
    struct ghash_key *ghash;      /* owned powers of GHASH's key for ghash.c; NULL = OpenSSL's GHASH */
    uint32_t job;
    struct auth_stream stream;    /* the engine's unicast datagrams' */
};

/* 0, or a negative errno (no randomness, no memory, no cipher) with p2p_last_error set. */
int auth_init(struct auth *a, const uint8_t key[AUTH_KEY], uint32_t job);
/* Another stream, with a session other than a's own: 0, or a negative errno (no randomness). */
int auth_stream_init(struct auth *a, struct auth_stream *st);
void auth_free(struct auth *a);
/* Stamps the header (already filled by wire_put_hdr) with st's session and counter and the job,
 * and writes its tag over the destination, the header and the body pieces (nbody <= AUTH_MAX_BODY). */
void auth_seal(struct auth *a, struct auth_stream *st, const struct auth_dest *to, uint8_t *hdr,
               const struct iovec *body, int nbody);
/* 1 when the datagram's tag is right for destination `at` (always 1 when tags are off); the job
 * field is the caller's to check. */
int auth_check(struct auth *a, const struct auth_dest *at, const uint8_t *dgram, size_t len);

#endif
