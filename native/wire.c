/* Header and body coding of the wire format (wire.h). */
#include "wire.h"
#include <string.h>

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
    memset(o + 24, 0, WIRE_HDR - 24);
}

int wire_get_hdr(const uint8_t *in, size_t len, struct wire_hdr *h) {
    if (len < WIRE_HDR) return -1;
    if (get16(in) != WIRE_MAGIC) return -2;
    if (in[2] != WIRE_VERSION) return -3;
    h->type = in[3];
    if (h->type < T_DATA || h->type > T_JOIN) return -4;
    h->sender = get16(in + 4);
    h->pass = get16(in + 6);
    h->msg = get32(in + 8);
    h->chunk = get32(in + 12);
    h->nchunks = get32(in + 16);
    h->chunk_size = (uint32_t)get16(in + 20) * 8;
    h->meta_len = (uint32_t)get16(in + 22) * 8;
    h->session = get64(in + 24);
    h->counter = get32(in + 32);
    h->job = get32(in + 36);
    return 0;
}

uint32_t wire_meta_len(uint32_t nseg, uint32_t app_len) {
    uint64_t len = ((uint64_t)META_FIXED + (uint64_t)META_ENTRY * nseg + app_len + 7) & ~7ull;
    return len > WIRE_META_MAX ? 0 : (uint32_t)len;
}

void wire_put_meta(uint8_t *o, const struct wire_meta *m) {
    memset(o, 0, m->meta_len);
    put32(o, m->meta_len);
    put32(o + 4, m->nseg);
    put64(o + 8, m->data_len);
    put32(o + 16, m->app_len);
    if (m->app_len) memcpy(o + META_FIXED + (size_t)META_ENTRY * m->nseg, m->app, m->app_len);
}

void wire_put_meta_segment(uint8_t *o, uint32_t i, const struct wire_segment *seg) {
    uint8_t *e = o + META_FIXED + (size_t)META_ENTRY * i;
    put64(e, seg->off);
    put64(e + 8, seg->len);
    put64(e + 16, seg->need);
}

static void get_segment(const uint8_t *p, uint32_t i, struct wire_segment *seg) {
    const uint8_t *e = p + META_FIXED + (size_t)META_ENTRY * i;
    seg->off = get64(e);
    seg->len = get64(e + 8);
    seg->need = get64(e + 16);
}

int wire_get_meta(const uint8_t *p, uint32_t meta_len, uint64_t cap, uint32_t chunk, uint64_t total,
                  struct wire_meta *m) {
    if (meta_len < META_FIXED || meta_len % 8 || chunk == 0 || cap < chunk || meta_len > cap) return -1;
    uint32_t nseg = get32(p + 4), app_len = get32(p + 16);
    uint64_t data_len = get64(p + 8);
    if (get32(p) != meta_len || (uint64_t)nseg * META_ENTRY + META_FIXED + app_len > meta_len) return -1;
    if (data_len > cap - meta_len) return -1;
    uint64_t end = meta_len + data_len;
    if (end <= cap - chunk || (total && total != end)) return -1; /* the end is in the last chunk, where it arrived */
    uint64_t prev = 0;
    for (uint32_t i = 0; i < nseg; i++) {
        struct wire_segment s;
        get_segment(p, i, &s);
        /* in order, apart, inside the data, 8-byte aligned (so typed reads of them are: the data
         * region starts 64-byte aligned) */
        if (s.off % 8 || s.off < prev || s.off > data_len || s.len > data_len - s.off || s.need > s.len) return -1;
        prev = s.off + s.len;
    }
    *m = (struct wire_meta){meta_len, nseg, data_len, app_len, p + META_FIXED + (size_t)META_ENTRY * nseg};
    return 0;
}

int wire_get_meta_segment(const uint8_t *p, const struct wire_meta *m, uint32_t i, struct wire_segment *seg) {
    if (i >= m->nseg) return -1;
    get_segment(p, i, seg);
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

void wire_put_probe(uint8_t *o, uint16_t pass) {
    put16(o, pass);
    put16(o + 2, 0);
}

uint16_t wire_get_probe(const uint8_t *i) { return get16(i); }

void wire_put_join(uint8_t *o, const struct join_body *j) {
    memcpy(o, &j->group, 4);
    put16(o + 4, j->port);
    put16(o + 6, 0);
}

void wire_get_join(const uint8_t *i, struct join_body *j) {
    memcpy(&j->group, i, 4);
    j->port = get16(i + 4);
}
