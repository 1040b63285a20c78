/* Header coding and SipHash-2-4 datagram authentication. */
#include "wire.h"
#include <string.h>

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                              \
    do {                                                                      \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);             \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);             \
    } while (0)

/* Streaming SipHash-2-4 so that header and payload (read in place) need no gathering copy. */
struct siphash {
    uint64_t v0, v1, v2, v3, tail;
    size_t len;
};

static void sip_init(struct siphash *s, const struct siphash_key *k) {
    s->v0 = 0x736f6d6570736575ULL ^ k->k0;
    s->v1 = 0x646f72616e646f6dULL ^ k->k1;
    s->v2 = 0x6c7967656e657261ULL ^ k->k0;
    s->v3 = 0x7465646279746573ULL ^ k->k1;
    s->tail = 0;
    s->len = 0;
}

static inline void sip_block(struct siphash *s, uint64_t m) {
    uint64_t v0 = s->v0, v1 = s->v1, v2 = s->v2, v3 = s->v3;
    v3 ^= m;
    SIPROUND; SIPROUND;
    v0 ^= m;
    s->v0 = v0; s->v1 = v1; s->v2 = v2; s->v3 = v3;
}

static void sip_update(struct siphash *s, const uint8_t *p, size_t n) {
    size_t fill = s->len & 7;
    s->len += n;
    while (fill && n) {  /* complete a pending partial block */
        s->tail |= (uint64_t)*p++ << (8 * fill);
        n--;
        if (++fill == 8) { sip_block(s, s->tail); s->tail = 0; fill = 0; }
    }
    for (; n >= 8; n -= 8, p += 8) sip_block(s, get64(p));
    for (size_t i = 0; i < n; i++) s->tail |= (uint64_t)p[i] << (8 * i);
}

static uint64_t sip_final(struct siphash *s) {
    uint64_t b = s->tail | ((uint64_t)(s->len & 0xff) << 56);
    sip_block(s, b);
    uint64_t v0 = s->v0, v1 = s->v1, v2 = s->v2 ^ 0xff, v3 = s->v3;
    SIPROUND; SIPROUND; SIPROUND; SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

void wire_key_init(struct siphash_key *k, const uint8_t key[16], uint32_t job) {
    k->k0 = get64(key);
    k->k1 = get64(key + 8);
    k->on = (k->k0 | k->k1) != 0;
    k->job = job;
}

static uint64_t tag_of(const struct siphash_key *k, const uint8_t *hdr, const struct iovec *body, int nbody) {
    if (!k->on) return k->job;
    struct siphash s;
    uint8_t job[4], zero[8] = {0};
    put32(job, k->job);
    sip_init(&s, k);
    sip_update(&s, job, 4);
    sip_update(&s, hdr, 24);
    sip_update(&s, zero, 8);
    for (int i = 0; i < nbody; i++) sip_update(&s, body[i].iov_base, body[i].iov_len);
    return sip_final(&s);
}

void wire_sign(const struct siphash_key *k, uint8_t *hdr, const struct iovec *body, int nbody) {
    put64(hdr + 24, tag_of(k, hdr, body, nbody));
}

int wire_verify(const struct siphash_key *k, const uint8_t *dgram, size_t len) {
    struct iovec body = {(void *)(dgram + WIRE_HDR), len - WIRE_HDR};
    return tag_of(k, dgram, &body, 1) == get64(dgram + 24);
}

void wire_put_hdr(uint8_t *o, const struct wire_hdr *h) {
    put16(o, WIRE_MAGIC);
    o[2] = WIRE_VERSION;
    o[3] = h->type;
    put16(o + 4, h->sender);
    put16(o + 6, h->pass);
    put32(o + 8, h->msg);
    put32(o + 12, h->chunk);
    put32(o + 16, h->nchunks);
    put16(o + 20, (uint16_t)(h->chunk_size / 8));
    put16(o + 22, (uint16_t)(h->meta_len / 8));
    put64(o + 24, 0);
}

int wire_get_hdr(const uint8_t *in, size_t len, struct wire_hdr *h) {
    if (len < WIRE_HDR) return -1;
    if (get16(in) != WIRE_MAGIC) return -2;
    if (in[2] != WIRE_VERSION) return -3;
    h->type = in[3];
    if (h->type < T_DATA || h->type > T_DONE) return -4;
    h->sender = get16(in + 4);
    h->pass = get16(in + 6);
    h->msg = get32(in + 8);
    h->chunk = get32(in + 12);
    h->nchunks = get32(in + 16);
    h->chunk_size = (uint32_t)get16(in + 20) * 8;
    h->meta_len = (uint32_t)get16(in + 22) * 8;
    return 0;
}

void wire_put_ack(uint8_t *o, const struct ack_body *a) {
    put16(o, a->pass);
    put16(o + 2, a->flags);
    put32(o + 4, a->pass_high);
    put32(o + 8, a->pass_count);
    put32(o + 12, a->total);
    put32(o + 16, a->start);
    put32(o + 20, a->nbits);
}

void wire_get_ack(const uint8_t *i, struct ack_body *a) {
    a->pass = get16(i);
    a->flags = get16(i + 2);
    a->pass_high = get32(i + 4);
    a->pass_count = get32(i + 8);
    a->total = get32(i + 12);
    a->start = get32(i + 16);
    a->nbits = get32(i + 20);
}

void wire_put_done(uint8_t *o, const struct done_body *d) {
    put32(o, d->flags);
    put32(o + 4, d->total);
    put32(o + 8, d->chunks);
}

void wire_get_done(const uint8_t *i, struct done_body *d) {
    d->flags = get32(i);
    d->total = get32(i + 4);
    d->chunks = get32(i + 8);
}
