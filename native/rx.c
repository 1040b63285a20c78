/* Receiving: what each datagram about an incoming message does to it. Datagrams are reassembled
 * into messages in place (rx_store.c holds them), acknowledged with bitmap slices (rx_ack.c), and
 * the message delivered whole, closed by the sender, or expired; tombstones (rx_ack.c) answer a
 * sender that missed the end of a message already delivered. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

#define ACK_EVERY 32              /* datagrams between receiver ACKs */
/* Through a group every member ACKs the same datagrams: each ACKs 4x less often, with a shorter
 * slice (ACK_BITS_GROUP, rx_ack.c), so that the sender's downlink carries no implosion of ACKs
 * however many members there are. */
#define ACK_EVERY_GROUP 128

/* With the meta in: has every segment at least the bytes its sender requires? */
static int bounds_met(const struct rx *m) {
    struct wire_meta meta;
    if (rx_get_meta(m, &meta) < 0) return 0;
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
    struct rx *m = rx_find(eng, h->sender, h->msg, src);
    if (!m) {
        if (rx_find_tomb(eng, h->sender, h->msg, src, now)) { CNT(eng, drop_stale, 1); return; }
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
            if (rx_get_meta(m, &meta) < 0) {
                CNT(eng, drop_bad_meta, 1);
                rx_add_tomb(eng, m, 0, now);
                rx_unlink_free(eng, m);
                return;
            }
        }
    }
    if (m->received == m->nchunks) {
        uint32_t total = m->dgrams, chunks = m->received;
        struct sockaddr_in to = m->src;
        uint32_t msg = m->msg;
        rx_deliver(eng, m, P2P_DELIVERED_COMPLETE, now);
        rx_send_done(eng, msg, &to, DONE_COMPLETE, total, chunks);
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
    struct rx *m = rx_find(eng, h->sender, h->msg, src);
    if (m && !same_geometry(m, h)) { CNT(eng, drop_bad_index, 1); return; }
    if (!m) {
        struct tombstone *t = rx_find_tomb(eng, h->sender, h->msg, src, now);
        if (t) {
            rx_send_done(eng, h->msg, src, t->flags, t->total, t->chunks);
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
    struct rx *m = rx_find(eng, h->sender, h->msg, src);
    if (m && !same_geometry(m, h)) { CNT(eng, drop_bad_index, 1); return; }
    if (!m) {
        struct tombstone *t = rx_find_tomb(eng, h->sender, h->msg, src, now);
        if (via_group) { /* answered with DONE at delivery already (a lost one: the unicast retry gets it) */
            if (t) CNT(eng, drop_stale, 1);
            else CNT(eng, drop_not_member, 1);
            return;
        }
        if (t) {
            rx_send_done(eng, h->msg, src, t->flags, t->total, t->chunks);
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
        rx_send_done(eng, h->msg, src, 0, 0, 0);
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
            rx_deliver(eng, m, P2P_DELIVERED_CLOSED, now);
            rx_send_done(eng, msg, src, 0, total, chunks);
            return;
        }
        rx_ack_all(eng, m, now);
        return;
    }
    uint32_t total = m->dgrams, chunks = m->received, msg = m->msg;
    rx_deliver(eng, m, P2P_DELIVERED_CLOSED, now);
    rx_send_done(eng, msg, src, 0, total, chunks);
}

void rx_timers(p2p_engine *eng, uint64_t now) {
    for (struct rx *m = eng->rxs, *next; m; m = next) {
        next = m->next;
        if (now - m->last_seen_ns > (uint64_t)eng->cfg.rx_idle_ms * 1000000ull) {
            rx_deliver(eng, m, P2P_DELIVERED_EXPIRED, now); /* the sender went silent: free, never leak */
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
