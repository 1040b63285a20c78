/* Receiving: datagrams are reassembled into messages in place, acknowledged with bitmap slices,
 * and delivered whole, closed by the sender, or expired; tombstones answer a sender that missed
 * the end of a message already delivered. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

#define ACK_EVERY 32              /* datagrams between receiver ACKs */
/* Through a group every member ACKs the same datagrams: each ACKs 4x less often, with a shorter
 * slice (what it says about older chunks the pass's probe answer says anyway), so that the
 * sender's downlink carries no implosion of ACKs however many members there are. */
#define ACK_EVERY_GROUP 128
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
static int rx_send_ack(p2p_engine *eng, struct rx *m, uint32_t start, uint32_t nbits, uint16_t flags, uint64_t now) {
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
static void rx_ack_recent(p2p_engine *eng, struct rx *m, uint64_t now) {
    uint32_t hi = m->pass_high ? m->pass_high : m->nchunks, bits = m->group >= 0 ? ACK_BITS_GROUP : ACK_BITS;
    uint32_t start = hi > bits ? (hi - bits + 7) & ~7u : 0;
    rx_send_ack(eng, m, start, hi - start, 0, now);
}

/* A probe answer: the whole bitmap, the last slice flagged FINAL. Where what the message brought
 * in cannot pay for another slice, the answer ends there (flagged FINAL): the sender resends the
 * chunks it did not hear of, and they pay for the rest. */
static void rx_ack_all(p2p_engine *eng, struct rx *m, uint64_t now) {
    for (uint32_t start = 0;; start += ACK_BITS) {
        uint32_t n = m->nchunks - start > ACK_BITS ? ACK_BITS : m->nchunks - start;
        int last = start + n >= m->nchunks || !affordable(m, 2 * (uint64_t)WIRE_ACK_MAX);
        if (!rx_send_ack(eng, m, start, n, last ? ACK_FINAL : 0, now) || last) break;
    }
}

static void send_done(p2p_engine *eng, uint32_t msg, const struct sockaddr_in *to, uint32_t flags, uint32_t total,
                      uint32_t chunks) {
    uint8_t body[DONE_BODY];
    struct done_body d = {flags, total, chunks};
    wire_put_done(body, &d);
    struct wire_hdr h = {.type = T_DONE, .msg = msg};
    dgram_send_ctl(eng, to, &h, body, sizeof body);
}

static struct tombstone *find_tomb(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src,
                                   uint64_t now) {
    for (uint32_t i = 0; i < TOMBSTONES; i++) {
        struct tombstone *t = &eng->tomb[i];
        if (t->at_ns && t->sender == sender && t->msg == msg && same_addr(&t->src, src) && now - t->at_ns < TOMB_NS)
            return t;
    }
    return NULL;
}

static void add_tomb(p2p_engine *eng, const struct rx *m, uint32_t flags, uint64_t now) {
    struct tombstone *t = &eng->tomb[eng->tomb_next++ % TOMBSTONES];
    t->sender = m->sender;
    t->msg = m->msg;
    t->src = m->src;
    t->flags = flags;
    t->total = m->dgrams;
    t->chunks = m->received;
    t->at_ns = now;
}

static void rx_unlink_free(p2p_engine *eng, struct rx *m) {
    for (struct rx **pp = &eng->rxs; *pp; pp = &(*pp)->next)
        if (*pp == m) { *pp = m->next; break; }
    eng->rx_open--;
    eng->rx_claimed -= m->cap;
    if (m->group >= 0) mcast_release(&eng->mc, m->group, now_ns());
    CNT(eng, receiving_messages, -1);
    CNT(eng, receiving_bytes, -(m->cap - (uint64_t)m->received * m->chunk));
    bufpool_give(m->base);
    free(m->bitmap);
    free(m);
}

/* The message's meta, decoded and checked (wire_get_meta): 0, or -1 when it is invalid. */
static int get_meta(const struct rx *m, struct wire_meta *meta) {
    return wire_get_meta(m->flat, m->meta_len, m->cap, m->chunk, m->total, meta);
}

/* With the meta in: has every segment at least the bytes its sender requires? */
static int bounds_met(const struct rx *m) {
    struct wire_meta meta;
    if (get_meta(m, &meta) < 0) return 0;
    uint32_t nseg = meta.nseg;
    if (!nseg) return 1;
    uint64_t *seg = malloc(sizeof(uint64_t) * 4 * (size_t)nseg);
    if (!seg) return 0;
    for (uint32_t i = 0; i < nseg; i++) {
        struct wire_segment e;
        wire_get_meta_segment(m->flat, &meta, i, &e);
        seg[i] = e.off;
        seg[nseg + i] = e.len;
        seg[2 * nseg + i] = e.need;
    }
    segment_coverage(m->bitmap, m->nchunks, m->chunk, m->meta_len, seg, seg + nseg, nseg, seg + 3 * nseg);
    int ok = 1;
    for (uint32_t i = 0; i < nseg && ok; i++) ok = seg[3 * nseg + i] >= seg[2 * nseg + i];
    free(seg);
    return ok;
}

/* Missing chunks read as zeros (the buffer is reused, so they hold an older message's bytes). */
static void zero_holes(struct rx *m) {
    if (m->received == m->nchunks) return;
    for (uint32_t k = 0; k < m->nchunks; k++)
        if (!BIT_GET(m->bitmap, k)) memset(m->flat + (uint64_t)k * m->chunk, 0, m->chunk);
}

static void deliver(p2p_engine *eng, struct rx *m, int reason, uint64_t now) {
    struct delivery_priv *d = calloc(1, sizeof *d);
    if (!d) { rx_unlink_free(eng, m); return; } /* nothing sensible to report; the sender sees no DONE */
    p2p_delivery *p = &d->pub;
    p->sender = m->sender;
    p->msg_id = m->msg;
    inet_ntop(AF_INET, &m->src.sin_addr, p->src_host, sizeof p->src_host);
    p->src_port = ntohs(m->src.sin_port);
    p->reason = reason;
    p->chunk_size = m->chunk;
    p->nchunks = m->nchunks;
    p->meta_len = m->meta_len;
    p->chunks_received = m->received;
    p->datagrams_received = m->dgrams;
    struct wire_meta meta;
    if (m->meta_received == m->meta_chunks && get_meta(m, &meta) == 0) {
        uint32_t nseg = meta.nseg;
        d->segs = malloc(sizeof(uint64_t) * 2 * ((size_t)nseg + 1));
        if (d->segs) {
            for (uint32_t i = 0; i < nseg; i++) {
                struct wire_segment e;
                wire_get_meta_segment(m->flat, &meta, i, &e);
                d->segs[i] = e.off;
                d->segs[nseg + i] = e.len;
            }
            p->layout_known = 1;
            p->nseg = nseg;
            p->seg_off = d->segs;
            p->seg_len = d->segs + nseg;
            p->app_len = meta.app_len;
            p->app = meta.app;
            p->data_len = meta.data_len;
        }
    }
    zero_holes(m);
    p->data = m->flat + m->meta_len;
    d->base = m->base;
    d->bitmap = m->bitmap;
    p->chunk_mask = m->bitmap;
    d->claim = m->cap;
    struct sockaddr_in src = m->src;
    add_tomb(eng, m, reason == P2P_DELIVERED_COMPLETE ? DONE_COMPLETE : 0, now);
    m->base = m->bitmap = NULL; /* now owned by the delivery */
    rx_unlink_free(eng, m);
    if (reason == P2P_DELIVERED_EXPIRED) CNT(eng, messages_expired, 1);
    else CNT(eng, messages_delivered, 1);
    pthread_mutex_lock(&eng->mu);
    struct delivery_priv *dropped = dq_push(eng, d, &src);
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    deliveries_free(dropped); /* outside the lock: freeing large messages takes a while */
}

/* Geometry from a DATA/PROBE/CLOSE header, checked before anything is allocated. */
static int geometry_ok(p2p_engine *eng, const struct wire_hdr *h) {
    if (h->chunk_size < WIRE_MIN_CHUNK || h->chunk_size > P2P_MAX_CHUNK || h->nchunks == 0 || h->meta_len < META_FIXED) {
        CNT(eng, drop_bad_index, 1); /* (a chunk no datagram can carry would only claim memory) */
        return 0;
    }
    uint64_t cap = (uint64_t)h->nchunks * h->chunk_size;
    if (h->meta_len > cap) { CNT(eng, drop_bad_index, 1); return 0; }
    if (cap > eng->cfg.max_message_bytes + h->chunk_size) { CNT(eng, drop_too_large, 1); return 0; }
    return 1;
}

/* The oldest partial message (of `src`, or of anyone when NULL); the list is newest first. */
static struct rx *oldest(p2p_engine *eng, const struct sockaddr_in *src) {
    struct rx *found = NULL;
    for (struct rx *m = eng->rxs; m; m = m->next)
        if (!src || same_addr(&m->src, src)) found = m;
    return found;
}

static void evict(p2p_engine *eng, struct rx *m, uint64_t now) {
    CNT(eng, drop_evicted, 1);
    add_tomb(eng, m, 0, now); /* what else comes for it is stale, not a new message */
    rx_unlink_free(eng, m);
}

/* Makes room for a message claiming `cap` bytes from `src` within the quotas, dropping the oldest
 * partial messages (of that source first); 0 if it can never fit. */
static int make_room(p2p_engine *eng, const struct sockaddr_in *src, uint64_t cap, uint64_t now) {
    if (cap > eng->cfg.max_partial_bytes) return 0;
    uint32_t mine = 0;
    for (struct rx *m = eng->rxs; m; m = m->next) mine += same_addr(&m->src, src);
    if (mine >= eng->cfg.max_partial_per_source) evict(eng, oldest(eng, src), now);
    while (eng->rx_open >= eng->cfg.max_partial_messages || eng->rx_claimed + cap > eng->cfg.max_partial_bytes)
        evict(eng, oldest(eng, NULL), now);
    return 1;
}

static struct rx *rx_create(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, uint64_t now) {
    if (!make_room(eng, src, (uint64_t)h->nchunks * h->chunk_size, now)) return NULL;
    struct rx *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->sender = h->sender;
    m->msg = h->msg;
    m->src = *src;
    m->group = -1;
    m->nchunks = h->nchunks;
    m->chunk = h->chunk_size;
    m->meta_len = h->meta_len;
    m->meta_chunks = (h->meta_len + h->chunk_size - 1) / h->chunk_size;
    m->cap = (uint64_t)h->nchunks * h->chunk_size;
    m->bitmap = calloc(1, (h->nchunks + 7) / 8 + 1);
    /* The data region starts 64-byte aligned (the pool's buffers are) so that arrays over it are
     * aligned too. The buffer is not zeroed: only what arrived is read, and a delivery zeroes its holes. */
    size_t pad = (64 - h->meta_len % 64) % 64;
    int fresh;
    m->base = bufpool_take(eng->rxpool, pad + m->cap + 64, &fresh);
    if (fresh) CNT(eng, rx_buffers_allocated, 1);
    m->flat = m->base ? m->base + pad : NULL;
    if (!m->bitmap || !m->base) {
        free(m->bitmap);
        bufpool_give(m->base);
        free(m);
        return NULL;
    }
    m->last_seen_ns = m->last_ack_ns = now;
    m->next = eng->rxs;
    eng->rxs = m;
    eng->rx_open++;
    eng->rx_claimed += m->cap;
    CNT(eng, receiving_messages, 1);
    CNT(eng, receiving_bytes, m->cap);
    return m;
}

static struct rx *find_rx(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src) {
    for (struct rx *m = eng->rxs; m; m = m->next)
        if (m->sender == sender && m->msg == msg && same_addr(&m->src, src)) return m;
    return NULL;
}

static int same_geometry(const struct rx *m, const struct wire_hdr *h) {
    return m->nchunks == h->nchunks && m->chunk == h->chunk_size && m->meta_len == h->meta_len;
}

static uint64_t next_random(p2p_engine *eng) {
    eng->rng ^= eng->rng >> 12;
    eng->rng ^= eng->rng << 25;
    eng->rng ^= eng->rng >> 27;
    return eng->rng * 0x2545F4914F6CDD1Dull;
}

void rx_on_data(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *payload,
                size_t len, int via_group, uint64_t now) {
    if (eng->cfg.drop_prob > 0 && (double)(next_random(eng) >> 11) / 9007199254740992.0 < eng->cfg.drop_prob) {
        CNT(eng, drop_injected, 1);
        return;
    }
    if (!geometry_ok(eng, h)) return;
    if (h->chunk >= h->nchunks) { CNT(eng, drop_bad_index, 1); return; }
    uint64_t off = (uint64_t)h->chunk * h->chunk_size;
    int last = h->chunk == h->nchunks - 1;
    if (len == 0 || len > h->chunk_size || (!last && len != h->chunk_size) || (last && off + len < h->meta_len)) {
        CNT(eng, drop_bad_length, 1);
        return;
    }
    struct rx *m = find_rx(eng, h->sender, h->msg, src);
    if (!m) {
        if (find_tomb(eng, h->sender, h->msg, src, now)) { CNT(eng, drop_stale, 1); return; }
        if (via_group) { CNT(eng, drop_not_member, 1); return; } /* only a JOIN opens a message to a group */
        if (!(m = rx_create(eng, h, src, now))) { CNT(eng, drop_too_large, 1); return; }
    } else if (!same_geometry(m, h)) {
        CNT(eng, drop_bad_index, 1);
        return;
    }
    m->last_seen_ns = now;
    m->bytes_in += WIRE_HDR + len;
    m->dgrams++;
    if (h->pass > m->pass) {
        m->pass = h->pass;
        m->pass_high = m->pass_count = 0;
    }
    if (h->pass == m->pass) {
        m->pass_count++;
        if (h->chunk + 1 > m->pass_high) m->pass_high = h->chunk + 1;
    }
    if (BIT_GET(m->bitmap, h->chunk)) {
        CNT(eng, drop_duplicate, 1);
    } else {
        if (last) {
            uint64_t total = off + len;
            if (m->total && m->total != total) { CNT(eng, drop_bad_length, 1); return; }
            m->total = total;
        }
        memcpy(m->flat + off, payload, len);
        if (last) memset(m->flat + off + len, 0, h->chunk_size - len); /* past the end: read as zeros */
        BIT_SET(m->bitmap, h->chunk);
        m->received++;
        CNT(eng, receiving_bytes, -(uint64_t)m->chunk);
        if (h->chunk < m->meta_chunks) m->meta_received++;
        if (m->meta_received == m->meta_chunks && h->chunk < m->meta_chunks) {
            struct wire_meta meta;
            if (get_meta(m, &meta) < 0) {
                CNT(eng, drop_bad_meta, 1);
                add_tomb(eng, m, 0, now);
                rx_unlink_free(eng, m);
                return;
            }
        }
    }
    if (m->received == m->nchunks) {
        uint32_t total = m->dgrams, chunks = m->received;
        struct sockaddr_in to = m->src;
        uint32_t msg = m->msg;
        deliver(eng, m, P2P_DELIVERED_COMPLETE, now);
        send_done(eng, msg, &to, DONE_COMPLETE, total, chunks);
        return;
    }
    if (++m->unacked >= (m->group >= 0 ? ACK_EVERY_GROUP : ACK_EVERY)) rx_ack_recent(eng, m, now);
}

/* A JOIN: the message will come through the sender's group. Opens it (within the quotas, as its
 * first DATA would), joins the group and answers; a group other than the sender's (a peer
 * configured otherwise), no multicast here, or no membership left is answered "unicast". */
void rx_on_join(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *body,
                size_t blen, uint64_t now) {
    if (blen != JOIN_BODY) { CNT(eng, drop_bad_length, 1); return; }
    if (!geometry_ok(eng, h)) return;
    struct rx *m = find_rx(eng, h->sender, h->msg, src);
    if (m && !same_geometry(m, h)) { CNT(eng, drop_bad_index, 1); return; }
    if (!m) {
        struct tombstone *t = find_tomb(eng, h->sender, h->msg, src, now);
        if (t) {
            send_done(eng, h->msg, src, t->flags, t->total, t->chunks);
            return;
        }
        if (!(m = rx_create(eng, h, src, now))) { CNT(eng, drop_too_large, 1); return; }
    }
    m->last_seen_ns = now;
    m->bytes_in += WIRE_HDR + blen;
    if (m->group < 0) {
        struct join_body j;
        struct sockaddr_in want;
        int slot = -EOPNOTSUPP;
        wire_get_join(body, &j);
        if (eng->mc.fd >= 0) {
            mcast_group_of(&eng->mc, h->sender, &want);
            slot = want.sin_addr.s_addr == j.group && j.port == eng->mc.port ? mcast_join(&eng->mc, j.group) : -EINVAL;
        }
        if (slot < 0) CNT(eng, mcast_refused, 1);
        else m->group = slot;
    }
    rx_send_ack(eng, m, 0, 0, m->group >= 0 ? ACK_JOINED : ACK_UNICAST, now);
}

void rx_on_probe_or_close(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src,
                          const uint8_t *body, size_t blen, int via_group, uint64_t now) {
    if ((h->type == T_PROBE && blen != PROBE_BODY) || (h->type == T_CLOSE && blen != 0)) {
        CNT(eng, drop_bad_length, 1);
        return;
    }
    if (!geometry_ok(eng, h)) return;
    struct rx *m = find_rx(eng, h->sender, h->msg, src);
    if (m && !same_geometry(m, h)) { CNT(eng, drop_bad_index, 1); return; }
    if (!m) {
        struct tombstone *t = find_tomb(eng, h->sender, h->msg, src, now);
        if (via_group) { /* answered with DONE at delivery already (a lost one: the unicast retry gets it) */
            if (t) CNT(eng, drop_stale, 1);
            else CNT(eng, drop_not_member, 1);
            return;
        }
        if (t) {
            send_done(eng, h->msg, src, t->flags, t->total, t->chunks);
            return;
        }
        if (h->type == T_PROBE) {
            /* Nothing arrived yet: an empty final answer makes the sender send everything again. */
            uint8_t ab[ACK_BODY];
            struct ack_body a = {wire_get_probe(body), ACK_FINAL, 0, 0, 0, 0, 0};
            wire_put_ack(ab, &a);
            struct wire_hdr r = {.type = T_ACK, .msg = h->msg, .nchunks = h->nchunks, .chunk_size = h->chunk_size,
                                 .meta_len = h->meta_len};
            dgram_send_ctl(eng, src, &r, ab, sizeof ab);
            return;
        }
        /* A CLOSE for a message never seen delivers nothing: a forged or replayed CLOSE must not
         * stand for a message (a BSP round would count it as come). The DONE still lets a real
         * sender whose every chunk was lost finish at once. */
        CNT(eng, drop_unknown, 1);
        send_done(eng, h->msg, src, 0, 0, 0);
        return;
    }
    m->last_seen_ns = now;
    m->bytes_in += WIRE_HDR + blen;
    if (h->type == T_PROBE) {
        uint16_t pass = wire_get_probe(body);
        if (pass > m->pass) {
            m->pass = pass;
            m->pass_high = m->pass_count = 0;
        }
        if (m->meta_received == m->meta_chunks && bounds_met(m)) {
            /* The pass is over and every bound is met: close here, one round trip sooner than
             * waiting for the sender's CLOSE. The bitmap still goes first, for the sender's stats. */
            rx_ack_all(eng, m, now);
            uint32_t total = m->dgrams, chunks = m->received, msg = m->msg;
            deliver(eng, m, P2P_DELIVERED_CLOSED, now);
            send_done(eng, msg, src, 0, total, chunks);
            return;
        }
        rx_ack_all(eng, m, now);
        return;
    }
    uint32_t total = m->dgrams, chunks = m->received, msg = m->msg;
    deliver(eng, m, P2P_DELIVERED_CLOSED, now);
    send_done(eng, msg, src, 0, total, chunks);
}

void rx_timers(p2p_engine *eng, uint64_t now) {
    for (struct rx *m = eng->rxs, *next; m; m = next) {
        next = m->next;
        if (now - m->last_seen_ns > (uint64_t)eng->cfg.rx_idle_ms * 1000000ull) {
            deliver(eng, m, P2P_DELIVERED_EXPIRED, now); /* the sender went silent: free, never leak */
            continue;
        }
        if (m->unacked && now - m->last_ack_ns >= ACK_DELAY_NS) rx_ack_recent(eng, m, now);
    }
}

uint64_t rx_next_wake(const p2p_engine *eng, uint64_t wake) {
    for (const struct rx *m = eng->rxs; m; m = m->next)
        if (m->unacked && m->last_ack_ns + ACK_DELAY_NS < wake) wake = m->last_ack_ns + ACK_DELAY_NS;
    return wake;
}

void rx_free_all(p2p_engine *eng) {
    while (eng->rxs) rx_unlink_free(eng, eng->rxs);
}
