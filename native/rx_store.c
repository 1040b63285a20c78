/* Partial messages, the engine's list of what is being received (eng->rxs): opened within the
 * quotas (max_partial_*: past them the oldest gives way, its source's first), found, and ended:
 * delivered (its buffers handed to a delivery on delivery.c's queue) or evicted, each leaving a
 * tombstone (rx_ack.c), or freed. I/O thread only. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

void rx_unlink_free(p2p_engine *eng, struct rx *m) {
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
int rx_get_meta(const struct rx *m, struct wire_meta *meta) {
    return wire_get_meta(m->flat, m->meta_len, m->cap, m->chunk, m->total, meta);
}

/* Missing chunks read as zeros (the buffer is reused, so they hold an older message's bytes). */
static void zero_holes(struct rx *m) {
    if (m->received == m->nchunks) return;
    for (uint32_t k = 0; k < m->nchunks; k++)
        if (!BIT_GET(m->bitmap, k)) memset(m->flat + (uint64_t)k * m->chunk, 0, m->chunk);
}

void rx_deliver(p2p_engine *eng, struct rx *m, int reason, uint64_t now) {
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
    if (m->meta_received == m->meta_chunks && rx_get_meta(m, &meta) == 0) {
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
    rx_add_tomb(eng, m, reason == P2P_DELIVERED_COMPLETE ? DONE_COMPLETE : 0, now);
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

/* The oldest partial message (of `src`, or of anyone when NULL); the list is newest first. */
static struct rx *oldest(p2p_engine *eng, const struct sockaddr_in *src) {
    struct rx *found = NULL;
    for (struct rx *m = eng->rxs; m; m = m->next)
        if (!src || same_addr(&m->src, src)) found = m;
    return found;
}

static void evict(p2p_engine *eng, struct rx *m, uint64_t now) {
    CNT(eng, drop_evicted, 1);
    rx_add_tomb(eng, m, 0, now); /* what else comes for it is stale, not a new message */
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

struct rx *rx_create(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, uint64_t now) {
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

struct rx *rx_find(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src) {
    for (struct rx *m = eng->rxs; m; m = m->next)
        if (m->sender == sender && m->msg == msg && same_addr(&m->src, src)) return m;
    return NULL;
}

void rx_free_all(p2p_engine *eng) {
    while (eng->rxs) rx_unlink_free(eng, eng->rxs);
}
