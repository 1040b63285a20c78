/* AES-256-GMAC datagram tags (auth.h). */
#define _GNU_SOURCE
#include "auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "engine.h"
#include "ghash.h"

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
    if (ghash_fast_available() && !getenv("P2P_PORTABLE_GHASH")) {
        uint8_t zero[16] = {0}, h[16];
        if (!(a->ghash = malloc(sizeof *a->ghash))) {
            auth_free(a);
            return set_error(ENOMEM, "auth: out of memory");
        }
        aes_block(zero, h, ecb);
        ghash_key_init(a->ghash, h);
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
    free(a->ghash);
    a->gcm = a->aes = NULL;
    a->ghash = NULL;
}

/* GMAC: GCM with the pieces as additional data and nothing to encrypt, under a 96-bit IV, into
 * tag[WIRE_TAG]: through ghash.c where the CPU runs it, else OpenSSL's GCM128 (the same bits). */
static void gmac(struct auth *a, const uint8_t iv[12], const struct iovec *pieces, int n, uint8_t tag[WIRE_TAG]) {
    if (a->ghash) {
        struct ghash_state st;
        uint8_t hash[16], j0[16] = {[15] = 1}, mask[16];
        ghash_start(&st);
        for (int i = 0; i < n; i++) ghash_update(a->ghash, &st, pieces[i].iov_base, pieces[i].iov_len);
        ghash_finish(a->ghash, &st, hash);
        memcpy(j0, iv, 12);  /* J0 = IV || 1: the tag is GHASH xor E_K(J0) */
        aes_block(j0, mask, a->aes);
        for (int i = 0; i < WIRE_TAG; i++) tag[i] = hash[i] ^ mask[i];
        return;
    }
    CRYPTO_gcm128_setiv(a->gcm, iv, 12);
    for (int i = 0; i < n; i++)
        if (pieces[i].iov_len) CRYPTO_gcm128_aad(a->gcm, pieces[i].iov_base, pieces[i].iov_len);
    CRYPTO_gcm128_tag(a->gcm, tag, WIRE_TAG);
}

/* A datagram's tag: GMAC over its destination, its header before the tag, and its body pieces,
 * under the IV the header carries (session || counter). */
static void datagram_tag(struct auth *a, const struct auth_dest *dest, const uint8_t *hdr, const struct iovec *body,
                         int nbody, uint8_t tag[WIRE_TAG]) {
    uint8_t where[8] = {0};       /* address (network order), port (little-endian), 0 */
    memcpy(where, &dest->addr, 4);
    put16(where + 4, dest->port);
    struct iovec pieces[2 + AUTH_MAX_BODY];
    pieces[0] = (struct iovec){where, sizeof where};
    pieces[1] = (struct iovec){(void *)hdr, WIRE_TAG_AT};
    for (int i = 0; i < nbody; i++) pieces[2 + i] = body[i];
    gmac(a, hdr + 24, pieces, 2 + nbody, tag);
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
        datagram_tag(a, to, hdr, body, nbody, hdr + WIRE_TAG_AT);
    } else {
        memset(hdr + WIRE_TAG_AT, 0, WIRE_TAG);
    }
}

int auth_check(struct auth *a, const struct auth_dest *at, const uint8_t *dgram, size_t len) {
    if (!a->gcm) return 1;
    struct iovec body = {(void *)(dgram + WIRE_HDR), len - WIRE_HDR};
    uint8_t tag[WIRE_TAG];
    datagram_tag(a, at, dgram, &body, 1, tag);
    return CRYPTO_memcmp(tag, dgram + WIRE_TAG_AT, WIRE_TAG) == 0; /* constant time */
}

int p2p_gmac(const uint8_t key[32], const uint8_t iv[12], const p2p_segment *pieces, uint32_t n, int portable,
             uint8_t tag[16]) {
    if (n > 64 || (n && !pieces)) return set_error(EINVAL, "gmac: at most 64 pieces");
    struct auth a;
    int rc = auth_init(&a, key, 0);
    if (rc) return rc;
    if (!a.gcm) return set_error(EINVAL, "gmac: an all-zero key turns tags off");
    if (portable) {
        free(a.ghash);
        a.ghash = NULL;
    }
    struct iovec v[64];
    for (uint32_t i = 0; i < n; i++) v[i] = (struct iovec){(void *)pieces[i].ptr, pieces[i].len};
    gmac(&a, iv, v, (int)n, tag);
    auth_free(&a);
    return 0;
}
