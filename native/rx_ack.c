/* What the receiver answers a sender: ACKs (bitmap slices: the stretch of a pass's latest chunks
 * every ACK_EVERY datagrams (rx.c), the whole bitmap to a probe), each within AMPLIFICATION times
 * what the message brought in; DONE, once a message ended; and the tombstones that answer (or drop
 * as stale) what still comes for a message it no longer holds. I/O thread only. */
#include <string.h>

#include "io.h"

/* Through a group each member ACKs 4x less often (ACK_EVERY_GROUP, rx.c) and with this shorter
 * slice: what it says about older chunks the pass's probe answer says anyway. */
#define ACK_BITS_GROUP 1024u
#define TOMB_NS 30000000000ull
#define ACK_BITS ((WIRE_ACK_MAX - WIRE_HDR - ACK_BODY) * 8u)
#define AMPLIFICATION 3           /* control bytes sent about a message per byte it brought in, at most */

/* Whether `bytes` more of control traffic about m stay within AMPLIFICATION times what m brought in:
 * a forged header claiming a huge message must not draw a huge bitmap back (to its spoofed source). */
static int affordable(const struct rx *m, uint64_t bytes) {
    return m->bytes_out + bytes <= AMPLIFICATION * m->bytes_in;
}

/* Sends one ACK slice; 0 when anti-amplification holds it back (counted). */
int rx_send_ack(p2p_engine *eng, struct rx *m, uint32_t start, uint32_t nbits, uint16_t flags, uint64_t now) {
    size_t blen = ACK_BODY + (nbits + 7) / 8;
    if (!affordable(m, WIRE_HDR + blen)) {
        CNT(eng, ack_limited, 1);
        return 0;
    }
    uint8_t body[WIRE_ACK_MAX - WIRE_HDR];
    struct ack_body a = {m->pass, flags, m->pass_high, m->pass_count, m->dgrams, start, nbits};
    wire_put_ack(body, &a);
    memcpy(body + ACK_BODY, m->bitmap + start / 8, (nbits + 7) / 8);
    if (nbits % 8) body[ACK_BODY + nbits / 8] &= (uint8_t)((1u << (nbits % 8)) - 1);
    struct wire_hdr h = {.type = T_ACK, .msg = m->msg, .nchunks = m->nchunks, .chunk_size = m->chunk,
                         .meta_len = m->meta_len};
    dgram_send_ctl(eng, &m->src, &h, body, blen);
    m->bytes_out += WIRE_HDR + blen;
    m->unacked = 0;
    m->last_ack_ns = now;
    return 1;
}

/* A periodic ACK: the stretch of the bitmap that this pass's latest chunks fall in. */
void rx_ack_recent(p2p_engine *eng, struct rx *m, uint64_t now) {
    uint32_t hi = m->pass_high ? m->pass_high : m->nchunks, bits = m->group >= 0 ? ACK_BITS_GROUP : ACK_BITS;
    uint32_t start = hi > bits ? (hi - bits + 7) & ~7u : 0;
    rx_send_ack(eng, m, start, hi - start, 0, now);
}

/* A probe answer: the whole bitmap, the last slice flagged FINAL. Where what the message brought
 * in cannot pay for another slice, the answer ends there (flagged FINAL): the sender resends the
 * chunks it did not hear of, and they pay for the rest. */
void rx_ack_all(p2p_engine *eng, struct rx *m, uint64_t now) {
    for (uint32_t start = 0;; start += ACK_BITS) {
        uint32_t n = m->nchunks - start > ACK_BITS ? ACK_BITS : m->nchunks - start;
        int last = start + n >= m->nchunks || !affordable(m, 2 * (uint64_t)WIRE_ACK_MAX);
        if (!rx_send_ack(eng, m, start, n, last ? ACK_FINAL : 0, now) || last) break;
    }
}

void rx_send_done(p2p_engine *eng, uint32_t msg, const struct sockaddr_in *to, uint32_t flags, uint32_t total,
                  uint32_t chunks) {
    uint8_t body[DONE_BODY];
    struct done_body d = {flags, total, chunks};
    wire_put_done(body, &d);
    struct wire_hdr h = {.type = T_DONE, .msg = msg};
    dgram_send_ctl(eng, to, &h, body, sizeof body);
}

struct tombstone *rx_find_tomb(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src,
                               uint64_t now) {
    for (uint32_t i = 0; i < TOMBSTONES; i++) {
        struct tombstone *t = &eng->tomb[i];
        if (t->at_ns && t->sender == sender && t->msg == msg && same_addr(&t->src, src) && now - t->at_ns < TOMB_NS)
            return t;
    }
    return NULL;
}

void rx_add_tomb(p2p_engine *eng, const struct rx *m, uint32_t flags, uint64_t now) {
    struct tombstone *t = &eng->tomb[eng->tomb_next++ % TOMBSTONES];
    t->sender = m->sender;
    t->msg = m->msg;
    t->src = m->src;
    t->flags = flags;
    t->total = m->dgrams;
    t->chunks = m->received;
    t->at_ns = now;
}
