/* AES-256-GMAC datagram tags (auth.h). */
#define _GNU_SOURCE
#include "auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>
#include <sys/random.h>

#include "engine.h"

static int random_session(uint64_t *out) {
    /* Once the kernel's pool is seeded getrandom cannot fail but for a signal: retry those. */
    for (int tries = 0; tries < 100; tries++)
        if (getrandom(out, sizeof *out, 0) == (ssize_t)sizeof *out) return 0;
    return -1;
}

int auth_init(struct auth *a, const uint8_t key[AUTH_KEY], uint32_t job) {
    memset(a, 0, sizeof *a);
    a->job = job;
    if (random_session(&a->session)) return set_error(errno, "getrandom: %s", strerror(errno));
    int on = 0;
    for (int i = 0; i < AUTH_KEY; i++) on |= key[i];
    if (!on) return 0;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx) return set_error(ENOMEM, "EVP_CIPHER_CTX_new: out of memory");
    if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return set_error(ENOTSUP, "libcrypto has no AES-256-GCM");
    }
    a->ctx = ctx;
    return 0;
}

void auth_free(struct auth *a) {
    EVP_CIPHER_CTX_free(a->ctx);
    a->ctx = NULL;
}

/* GMAC: GCM with everything as additional data and nothing to encrypt. */
static void tag_of(struct auth *a, const uint8_t *hdr, const struct iovec *body, int nbody, uint8_t tag[WIRE_TAG]) {
    EVP_CIPHER_CTX *ctx = a->ctx;
    uint8_t iv[12];
    int n;
    memcpy(iv, hdr + 24, 12); /* session || counter */
    EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv);
    EVP_EncryptUpdate(ctx, NULL, &n, hdr, WIRE_TAG_AT);
    for (int i = 0; i < nbody; i++)
        if (body[i].iov_len) EVP_EncryptUpdate(ctx, NULL, &n, body[i].iov_base, (int)body[i].iov_len);
    EVP_EncryptFinal_ex(ctx, tag, &n);
    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, WIRE_TAG, tag);
}

void auth_seal(struct auth *a, uint8_t *hdr, const struct iovec *body, int nbody) {
    if (a->counter == UINT32_MAX) { /* the IV must never repeat under the key */
        uint64_t fresh;
        while (random_session(&fresh) || fresh == a->session) {}
        a->session = fresh;
        a->counter = 0;
    }
    put64(hdr + 24, a->session);
    put32(hdr + 32, a->counter++);
    put32(hdr + 36, a->job);
    if (a->ctx) tag_of(a, hdr, body, nbody, hdr + WIRE_TAG_AT);
    else memset(hdr + WIRE_TAG_AT, 0, WIRE_TAG);
}

int auth_check(struct auth *a, const uint8_t *dgram, size_t len) {
    if (get32(dgram + 36) != a->job) return 0;
    if (!a->ctx) return 1;
    struct iovec body = {(void *)(dgram + WIRE_HDR), len - WIRE_HDR};
    uint8_t tag[WIRE_TAG];
    tag_of(a, dgram, &body, 1, tag);
    return CRYPTO_memcmp(tag, dgram + WIRE_TAG_AT, WIRE_TAG) == 0;
}
