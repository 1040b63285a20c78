/* Deliveries: the queue between the I/O thread (rx.c delivers) and p2p_recv, with its per-source
 * quotas (max_queued_messages/bytes: past them the source holding the most gives way), and the
 * caller's view of a delivery: freeing it, filling what did not arrive, per-segment fractions.
 * Ownership: a delivery is the queue's (under eng->mu) until p2p_recv hands it to the caller, who
 * frees it (p2p_delivery_free); its buffers are the message's, taken over from rx.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

/* The queue's record of the source at `addr`, made (holding nothing yet) where it has none; NULL:
 * out of memory. With eng->mu held. */
static struct queued_source *queued_source_of(p2p_engine *eng, const struct sockaddr_in *addr) {
    for (struct queued_source *s = eng->dq_sources; s; s = s->next)
        if (same_addr(&s->addr, addr)) return s;
    struct queued_source *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->addr = *addr;
    s->next = eng->dq_sources;
    eng->dq_sources = s;
    return s;
}

/* The oldest waiting delivery of the source holding the most of the queue (messages, or bytes when
 * by_bytes; a tie goes to the source whose oldest delivery waited longest), *prev the one before
 * it; NULL when the queue is empty. One walk: a source's first delivery met is its oldest. */
static struct delivery_priv *crowding(p2p_engine *eng, int by_bytes, struct delivery_priv **prev) {
    struct delivery_priv *found = NULL;
    uint64_t most = 0;
    for (struct delivery_priv *p = NULL, *d = eng->dq_head; d; p = d, d = d->next) {
        uint64_t held = by_bytes ? d->from->bytes : d->from->messages;
        if (held > most) {
            most = held;
            found = d;
            *prev = p;
        }
    }
    return found;
}

/* With eng->mu held: puts d, delivered from `src`, at the end of the queue, then drops the oldest
 * delivery of the source holding the most until the queue is within its quotas (max_queued_*).
 * Dropping from the largest rather than refusing the newest keeps honest peers' messages: a flood
 * that filled the queue first gives way to what others send after it, and a source's newest (its
 * latest round) outlives its oldest. d itself goes only when its source had nothing else waiting
 * and d alone claims more bytes than any other source holds. Returns what it dropped (linked
 * through next) for the caller to free once it unlocked. */
struct delivery_priv *dq_push(p2p_engine *eng, struct delivery_priv *d, const struct sockaddr_in *src) {
    d->from = queued_source_of(eng, src);
    if (!d->from) return d; /* out of memory: as if it never came (as in deliver) */
    d->from->messages++;
    d->from->bytes += d->claim;
    CNT(eng, queued_messages, 1);
    CNT(eng, queued_bytes, d->claim);
    if (eng->dq_tail) eng->dq_tail->next = d; else eng->dq_head = d;
    eng->dq_tail = d;
    struct delivery_priv *dropped = NULL;
    for (;;) {
        int by_bytes = eng->counters.queued_bytes > eng->cfg.max_queued_bytes;
        if (!by_bytes && eng->counters.queued_messages <= eng->cfg.max_queued_messages) return dropped;
        struct delivery_priv *prev = NULL, *victim = crowding(eng, by_bytes, &prev); /* the queue is not empty */
        dq_remove(eng, victim, prev);
        victim->next = dropped;
        dropped = victim;
        CNT(eng, drop_queue_full, 1);
    }
}

static int delivery_or_closing(const void *arg) {
    const p2p_engine *eng = arg;
    return eng->dq_head || eng->closing;
}

void dq_remove(p2p_engine *eng, struct delivery_priv *d, struct delivery_priv *prev) {
    if (prev) prev->next = d->next; else eng->dq_head = d->next;
    if (eng->dq_tail == d) eng->dq_tail = prev;
    d->next = NULL;
    struct queued_source *s = d->from;
    s->messages--;
    s->bytes -= d->claim;
    if (!s->messages) {
        for (struct queued_source **pp = &eng->dq_sources; *pp; pp = &(*pp)->next)
            if (*pp == s) { *pp = s->next; break; }
        free(s);
    }
    d->from = NULL;
    CNT(eng, queued_messages, -1);
    CNT(eng, queued_bytes, -d->claim);
}

int p2p_recv(p2p_engine *eng, int timeout_ms, p2p_delivery **out) {
    pthread_mutex_lock(&eng->mu);
    engine_wait(eng, delivery_or_closing, eng, timeout_ms);
    struct delivery_priv *d = eng->dq_head;
    if (d) dq_remove(eng, d, NULL);
    int closing = eng->closing;
    pthread_mutex_unlock(&eng->mu);
    if (d) { *out = &d->pub; return 0; }
    if (closing) return set_error(ESHUTDOWN, "engine is closed");
    return 1;
}

void p2p_delivery_free(p2p_delivery *pub) {
    if (!pub) return;
    struct delivery_priv *d = (struct delivery_priv *)pub;
    bufpool_give(d->base);
    free(d->bitmap);
    free(d->segs);
    free(d);
}

void deliveries_free(struct delivery_priv *list) {
    while (list) {
        struct delivery_priv *next = list->next;
        p2p_delivery_free(&list->pub);
        list = next;
    }
}

/* Calls fn for each [lo, hi) piece of segment i, in data-region offsets, that a missing chunk covers. */
typedef void (*hole_fn)(p2p_delivery *d, uint32_t seg, uint64_t lo, uint64_t hi, const p2p_segment *src);

static void for_each_hole(p2p_delivery *d, hole_fn fn, const p2p_segment *src) {
    uint32_t seg = 0;
    for (uint32_t k = 0; k < d->nchunks; k++) {
        if (BIT_GET(d->chunk_mask, k)) continue;
        uint64_t a = (uint64_t)k * d->chunk_size, b = a + d->chunk_size;
        a = a > d->meta_len ? a - d->meta_len : 0;
        b = b > d->meta_len ? b - d->meta_len : 0;
        while (seg < d->nseg && d->seg_off[seg] + d->seg_len[seg] <= a) seg++;
        for (uint32_t i = seg; i < d->nseg && d->seg_off[i] < b; i++) {
            uint64_t lo = a > d->seg_off[i] ? a : d->seg_off[i];
            uint64_t hi = b < d->seg_off[i] + d->seg_len[i] ? b : d->seg_off[i] + d->seg_len[i];
            if (hi > lo) fn(d, i, lo, hi, src);
        }
    }
}

static void fill_zero(p2p_delivery *d, uint32_t seg, uint64_t lo, uint64_t hi, const p2p_segment *src) {
    (void)seg;
    (void)src;
    memset(d->data + lo, 0, hi - lo);
}

static void fill_copy(p2p_delivery *d, uint32_t seg, uint64_t lo, uint64_t hi, const p2p_segment *src) {
    memcpy(d->data + lo, (const uint8_t *)src[seg].ptr + (lo - d->seg_off[seg]), hi - lo);
}

int p2p_fill(p2p_delivery *d, int mode, const p2p_segment *src, uint32_t nsrc) {
    if (!d->layout_known) return set_error(EINVAL, "the message's layout never arrived; nothing to fill");
    if (mode == P2P_FILL_ZERO) {
        for_each_hole(d, fill_zero, NULL);
        return 0;
    }
    if (mode != P2P_FILL_COPY) return set_error(EINVAL, "unknown fill mode %d", mode);
    if (nsrc != d->nseg) return set_error(EINVAL, "fill source has %u segments, the message %u", nsrc, d->nseg);
    for (uint32_t i = 0; i < nsrc; i++)
        if (src[i].len != d->seg_len[i] || (src[i].len && !src[i].ptr))
            return set_error(EINVAL, "fill source segment %u: %llu bytes, the message's has %llu", i,
                             (unsigned long long)src[i].len, (unsigned long long)d->seg_len[i]);
    for_each_hole(d, fill_copy, src);
    return 0;
}

int p2p_delivery_fractions(const p2p_delivery *d, double *out, uint32_t nseg) {
    if (nseg != d->nseg) return set_error(EINVAL, "expected %u segment slots, got %u", d->nseg, nseg);
    if (!nseg) return 0;
    uint64_t *cov = malloc(sizeof(uint64_t) * nseg);
    if (!cov) return set_error(ENOMEM, "out of memory");
    segment_coverage(d->chunk_mask, d->nchunks, d->chunk_size, d->meta_len, d->seg_off, d->seg_len, nseg, cov);
    for (uint32_t i = 0; i < nseg; i++) out[i] = d->seg_len[i] ? (double)cov[i] / (double)d->seg_len[i] : 1.0;
    free(cov);
    return 0;
}
