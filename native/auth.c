/* AES-256-GMAC datagram tags (auth.h). */
#define _GNU_SOURCE
#include "auth.h"

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
#include <string.h>
#include <sys/random.h>

#include "engine.h"

static int random_session(uint64_t *out) {
    /* Once the kernel's pool is seeded getrandom cannot fail but for a signal: retry those. */
    for (int tries = 0; tries < 100; tries++)
        if (getrandom(out, sizeof *out, 0) == (ssize_t)sizeof *out) return 0;
    return -1;
}

/* The block cipher GCM runs on: one AES-256 block through the ECB context (AES-NI). */
static void aes_block(const unsigned char in[16], unsigned char out[16], const void *ecb) {
    int n;
    EVP_EncryptUpdate((EVP_CIPHER_CTX *)ecb, out, &n, in, 16);
}

int auth_init(struct auth *a, const uint8_t key[AUTH_KEY], uint32_t job) {
    memset(a, 0, sizeof *a);
    a->job = job;
    if (random_session(&a->stream.session)) return set_error(errno, "getrandom: %s", strerror(errno));
    int on = 0;
    for (int i = 0; i < AUTH_KEY; i++) on |= key[i];
    if (!on) return 0;
    EVP_CIPHER_CTX *ecb = EVP_CIPHER_CTX_new();
    if (!ecb) return set_error(ENOMEM, "EVP_CIPHER_CTX_new: out of memory");
    a->aes = ecb;
    if (EVP_EncryptInit_ex(ecb, EVP_aes_256_ecb(), NULL, key, NULL) != 1 || !EVP_CIPHER_CTX_set_padding(ecb, 0)) {
        auth_free(a);
        return set_error(ENOTSUP, "libcrypto has no AES-256");
    }
    if (!(a->gcm = CRYPTO_gcm128_new(ecb, aes_block))) { /* computes GHASH's key now */
        auth_free(a);
        return set_error(ENOMEM, "CRYPTO_gcm128_new: out of memory");
    }
    return 0;
}

int auth_stream_init(struct auth *a, struct auth_stream *st) {
    st->counter = 0;
    do {
        if (random_session(&st->session)) return set_error(errno, "getrandom: %s", strerror(errno));
    } while (st->session == a->stream.session);
    return 0;
}

void auth_free(struct auth *a) {
    if (a->gcm) CRYPTO_gcm128_release(a->gcm);
    EVP_CIPHER_CTX_free(a->aes);
    a->gcm = a->aes = NULL;
}

/* GMAC: GCM with everything as additional data and nothing to encrypt. Leaves the GHASH state
 * ready for CRYPTO_gcm128_tag (seal) or CRYPTO_gcm128_finish (check). */
static void gmac(struct auth *a, const struct auth_dest *dest, const uint8_t *hdr, const struct iovec *body,
                 int nbody) {
    uint8_t where[8] = {0};       /* address (network order), port (little-endian), 0 */
    memcpy(where, &dest->addr, 4);
    put16(where + 4, dest->port);
    CRYPTO_gcm128_setiv(a->gcm, hdr + 24, 12); /* session || counter */
    CRYPTO_gcm128_aad(a->gcm, where, sizeof where);
    CRYPTO_gcm128_aad(a->gcm, hdr, WIRE_TAG_AT);
    for (int i = 0; i < nbody; i++)
        if (body[i].iov_len) CRYPTO_gcm128_aad(a->gcm, body[i].iov_base, body[i].iov_len);
}

void auth_seal(struct auth *a, struct auth_stream *st, const struct auth_dest *to, uint8_t *hdr,
               const struct iovec *body, int nbody) {
    if (st->counter == UINT32_MAX) { /* the IV must never repeat under the key */
        uint64_t fresh;
        while (random_session(&fresh) || fresh == st->session) {}
        st->session = fresh;
        st->counter = 0;
    }
    put64(hdr + 24, st->session);
    put32(hdr + 32, st->counter++);
    put32(hdr + 36, a->job);
    if (a->gcm) {
        gmac(a, to, hdr, body, nbody);
        CRYPTO_gcm128_tag(a->gcm, hdr + WIRE_TAG_AT, WIRE_TAG);
    } else {
        memset(hdr + WIRE_TAG_AT, 0, WIRE_TAG);
    }
}

int auth_check(struct auth *a, const struct auth_dest *at, const uint8_t *dgram, size_t len) {
    if (!a->gcm) return 1;
    struct iovec body = {(void *)(dgram + WIRE_HDR), len - WIRE_HDR};
    gmac(a, at, dgram, &body, 1);
    return CRYPTO_gcm128_finish(a->gcm, dgram + WIRE_TAG_AT, WIRE_TAG) == 0; /* constant time */
}
