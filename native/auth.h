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

/* One sequence of IVs. A receiver's replay window follows each (sender, session) in counter order,
 * so datagrams that reach it by different paths (its unicast socket, a multicast group's) and can
 * overtake one another there each take a stream of their own. */
struct auth_stream {
    uint64_t session;             /* random */
    uint32_t counter;             /* the next datagram's; a new session when it wraps */
};

struct auth {
    void *aes;                    /* owned EVP_CIPHER_CTX: AES-256-ECB under the data key */
    void *gcm;                    /* owned GCM128_CONTEXT over it; NULL = tags off */
    uint32_t job;
    struct auth_stream stream;    /* the engine's unicast datagrams' */
};

/* 0, or a negative errno (no randomness, no memory, no cipher) with p2p_last_error set. */
int auth_init(struct auth *a, const uint8_t key[AUTH_KEY], uint32_t job);
/* Another stream, with a session other than a's own: 0, or a negative errno (no randomness). */
int auth_stream_init(struct auth *a, struct auth_stream *st);
void auth_free(struct auth *a);
/* Stamps the header (already filled by wire_put_hdr) with st's session and counter and the job,
 * and writes its tag over the header and the body pieces. */
void auth_seal(struct auth *a, struct auth_stream *st, uint8_t *hdr, const struct iovec *body, int nbody);
/* 1 when the datagram is of this job and its tag is right (always 1 on the job when tags are off). */
int auth_check(struct auth *a, const uint8_t *dgram, size_t len);

#endif
