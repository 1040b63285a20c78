/* The public API of sends: p2p_send_start lays a message out ([meta][segments], the meta encoded by
 * wire.c), cuts it into chunks, sets up each receiver's send (and its group's) and queues it for the
 * I/O thread; p2p_send_wait, p2p_send_receiver_stats and p2p_send_release are the caller's view of
 * it afterwards. Ownership: send.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "send.h"

static uint64_t align8(uint64_t x) { return (x + 7) & ~7ull; }

/* Lays out [meta][segments] and fills the meta: the segment table and the application blob. */
static int build_layout(struct p2p_send *s, const p2p_segment *segs, const p2p_send_options *opt) {
    uint32_t app_len = opt ? opt->app_len : 0;
    uint32_t meta = wire_meta_len(s->nseg, app_len);
    if (!meta) return set_error(EINVAL, "too many segments or too large an app descriptor");
    s->meta_len = meta;
    uint64_t off = meta;
    for (uint32_t i = 0; i < s->nseg; i++) {
        double b = segs[i].loss_bound;
        if (!(b >= 0 && b < 1)) return set_error(EINVAL, "segment %u: loss bound must be in [0, 1), got %g", i, b);
        if (segs[i].len && !segs[i].ptr) return set_error(EINVAL, "segment %u: NULL pointer", i);
        off = align8(off);
        s->seg_ptr[i] = segs[i].ptr;
        s->seg_flat[i] = off;
        s->seg_len[i] = segs[i].len;
        uint64_t need = (uint64_t)ceil((1.0 - b) * (double)segs[i].len);
        s->seg_need[i] = need > segs[i].len ? segs[i].len : need;
        off += segs[i].len;
    }
    s->total = off;
    if (!(s->meta = malloc(meta))) return set_error(ENOMEM, "out of memory");
    struct wire_meta m = {meta, s->nseg, s->total - meta, app_len, app_len ? opt->app : NULL};
    wire_put_meta(s->meta, &m);
    for (uint32_t i = 0; i < s->nseg; i++) {
        struct wire_segment seg = {s->seg_flat[i] - meta, s->seg_len[i], s->seg_need[i]};
        wire_put_meta_segment(s->meta, i, &seg);
    }
    return 0;
}

static int build_chunks(struct p2p_send *s, uint32_t chunk) {
    uint64_t n = (s->total + chunk - 1) / chunk;
    if (n > 0xFFFFFFF0ull) return set_error(EINVAL, "message too large for chunk size %u", chunk);
    s->chunk = chunk;
    s->nchunks = (uint32_t)n;
    s->meta_chunks = (s->meta_len + chunk - 1) / chunk;
    s->chunk_seg = malloc(sizeof(uint32_t) * n);
    if (!s->chunk_seg) return set_error(ENOMEM, "out of memory");
    uint32_t seg = 0;
    for (uint32_t k = 0; k < s->nchunks; k++) {
        uint64_t start = (uint64_t)k * chunk;
        while (seg < s->nseg && s->seg_flat[seg] + s->seg_len[seg] <= start) seg++;
        s->chunk_seg[k] = seg;
    }
    return 0;
}

static int init_receiver(struct p2p_send *s, struct txr *r, const p2p_receiver *in, uint64_t now) {
    int rc = parse_ipv4(in->host, in->port, &r->addr);
    if (rc) return rc;
    if (!(in->rate >= 0)) return set_error(EINVAL, "receiver %s: rate must be >= 0", in->host);
    if (!in->port) return set_error(EINVAL, "receiver %s: port 0", in->host);
    if (in->multicast != 0 && in->multicast != 1)
        return set_error(EINVAL, "receiver %s: multicast must be 0 or 1, got %d", in->host, in->multicast);
    if (in->multicast && s->eng->mc.fd < 0)
        return set_error(EINVAL, "receiver %s: multicast asked, but this engine has no mcast_port", in->host);
    r->pace.rate = in->rate;
    r->member.follows = (uint8_t)in->multicast;
    r->state = in->multicast ? S_JOIN : S_SEND;
    r->pace.refill_ns = now;
    r->acked.chunks = calloc(1, (s->nchunks + 7) / 8 + 1);
    r->acked.seg_bytes = calloc(s->nseg + 1, sizeof(uint64_t));
    r->acked.seg_ok = calloc(s->nseg + 1, 1);
    if (!r->acked.chunks || !r->acked.seg_bytes || !r->acked.seg_ok) return set_error(ENOMEM, "out of memory");
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->seg_need[i] == 0) { r->acked.seg_ok[i] = 1; r->acked.nseg_ok++; }
        r->acked.need_left += s->seg_need[i];
    }
    r->pass.len = s->nchunks;
    r->report.passes = 1;
    r->timer.last_ack_ns = r->timer.last_heard_ns = now;
    r->timer.rto_ns = 50000000ull;
    return 0;
}

/* The send to this sender's group, for the receivers that asked for multicast: paced at the
 * slowest one's rate (the first positive; unpaced only if every one is). */
static int init_group(struct p2p_send *s, uint64_t now) {
    struct txr *g = NULL;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        const struct txr *r = &s->r[i];
        if (!r->member.follows) continue;
        if (!g && !(g = s->group = calloc(1, sizeof *g))) return set_error(ENOMEM, "out of memory");
        if (r->pace.rate > 0 && (g->pace.rate == 0 || r->pace.rate < g->pace.rate)) g->pace.rate = r->pace.rate;
    }
    if (!g) return 0;
    mcast_group_of(&s->eng->mc, s->eng->cfg.sender_id, &g->addr);
    g->state = S_JOIN;
    g->pass.len = s->nchunks;
    g->report.passes = 1;
    g->pace.refill_ns = g->timer.last_ack_ns = g->timer.last_heard_ns = now;
    g->timer.rto_ns = 50000000ull;
    return 0;
}

/* Slow close: each paced receiver's limit, start + factor x its planned time (the message's wire
 * bytes at the pace it is sent at: a multicast member's is its group's, the slowest member's). */
static int init_slow(struct p2p_send *s, double factor) {
    if (!(factor == 0 || (factor >= 1 && factor < 1e9)))
        return set_error(EINVAL, "slow_factor must be 0 (off) or in [1, 1e9), got %g", factor);
    if (factor == 0) return 0;
    double wire = (double)s->total + (double)s->nchunks * (WIRE_HDR + WIRE_OVERHEAD);
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (r->pace.rate <= 0) continue; /* unpaced: no plan */
        double pace = r->member.follows && s->group->pace.rate > 0 ? s->group->pace.rate : r->pace.rate;
        double limit_ns = factor * wire / pace * 1e9;
        if (limit_ns < 1e18) r->timer.slow_ns = s->start_ns + (uint64_t)limit_ns; /* else: never in this job's life */
    }
    return 0;
}

void send_unref(struct p2p_send *s) {
    p2p_engine *eng = s->eng;
    pthread_mutex_lock(&eng->mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&eng->mu);
    if (!last) return;
    for (uint32_t i = 0; s->r && i < s->nrcv; i++) {
        free(s->r[i].acked.chunks);
        free(s->r[i].acked.seg_bytes);
        free(s->r[i].acked.seg_ok);
        free(s->r[i].pass.list);
    }
    free(s->r);
    if (s->group) free(s->group->pass.list);
    free(s->group);
    free(s->seg_ptr);
    free(s->seg_flat);
    free(s->seg_len);
    free(s->seg_need);
    free(s->meta);
    free(s->chunk_seg);
    free(s);
    engine_unref(eng);
}

int p2p_send_start(p2p_engine *eng, uint32_t msg_id, const p2p_segment *segs, uint32_t nseg,
                   const p2p_receiver *rcv, uint32_t nrcv, const p2p_send_options *opt, p2p_send **out) {
    struct p2p_send *s = calloc(1, sizeof *s);
    if (!s) return set_error(ENOMEM, "out of memory");
    s->eng = eng;
    s->refs = 1;
    s->msg = msg_id;
    s->nseg = nseg;
    s->nrcv = nrcv;
    pthread_mutex_lock(&eng->mu);
    eng->refs++;
    pthread_mutex_unlock(&eng->mu);
    int rc;
    s->seg_ptr = calloc(nseg + 1, sizeof *s->seg_ptr);
    s->seg_flat = calloc(nseg + 1, sizeof(uint64_t));
    s->seg_len = calloc(nseg + 1, sizeof(uint64_t));
    s->seg_need = calloc(nseg + 1, sizeof(uint64_t));
    s->r = calloc(nrcv + 1, sizeof(struct txr));
    if (!s->seg_ptr || !s->seg_flat || !s->seg_len || !s->seg_need || !s->r) {
        rc = set_error(ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = build_layout(s, segs, opt))) goto fail;
    uint32_t chunk = opt && opt->chunk_size ? opt->chunk_size : P2P_MAX_CHUNK;
    if (opt && opt->chunk_size && (chunk < WIRE_MIN_CHUNK || chunk > P2P_MAX_CHUNK || chunk % 8)) {
        rc = set_error(EINVAL, "chunk_size must be a multiple of 8 in [%u, %u], got %u", WIRE_MIN_CHUNK, P2P_MAX_CHUNK,
                       chunk);
        goto fail;
    }
    for (uint32_t i = 0; i < nrcv && !(opt && opt->chunk_size); i++) {
        uint32_t c;
        if ((rc = p2p_path_chunk_size(eng, rcv[i].host, &c))) goto fail;
        if (c < chunk) chunk = c;
    }
    if ((rc = build_chunks(s, chunk))) goto fail;
    uint64_t now = now_ns();
    s->start_ns = now;
    s->deadline_ns = opt && opt->deadline_ms ? now + (uint64_t)opt->deadline_ms * 1000000ull : 0;
    for (uint32_t i = 0; i < nrcv; i++)
        if ((rc = init_receiver(s, &s->r[i], &rcv[i], now))) goto fail;
    if ((rc = init_group(s, now))) goto fail;
    if ((rc = init_slow(s, opt ? opt->slow_factor : 0))) goto fail;
    s->nactive = nrcv;
    s->refs = 2; /* the caller's and the I/O thread's */
    pthread_mutex_lock(&eng->mu);
    if (eng->closing) {
        pthread_mutex_unlock(&eng->mu);
        rc = set_error(ESHUTDOWN, "engine is closed");
        s->refs = 1;
        goto fail;
    }
    if (eng->cmd_tail) eng->cmd_tail->next = s; else eng->cmd_head = s;
    eng->cmd_tail = s;
    pthread_mutex_unlock(&eng->mu);
    engine_wake(eng);
    __atomic_fetch_add(&eng->counters.messages_sent, 1, __ATOMIC_RELAXED);
    *out = s;
    return 0;
fail:
    send_unref(s);
    return rc;
}

static int send_done(const void *arg) { return ((const struct p2p_send *)arg)->done; }

int p2p_send_wait(p2p_send *s, int timeout_ms) {
    p2p_engine *eng = s->eng;
    pthread_mutex_lock(&eng->mu);
    engine_wait(eng, send_done, s, timeout_ms);
    int done = s->done;
    pthread_mutex_unlock(&eng->mu);
    return done ? 0 : 1;
}

int p2p_send_receiver_stats(p2p_send *s, uint32_t i, p2p_receiver_stats *out, double *fractions, uint32_t nseg) {
    if (i >= s->nrcv) return set_error(EINVAL, "receiver index %u out of range (%u receivers)", i, s->nrcv);
    if (fractions && nseg != s->nseg) return set_error(EINVAL, "expected %u segment slots, got %u", s->nseg, nseg);
    p2p_engine *eng = s->eng;
    pthread_mutex_lock(&eng->mu);
    int done = s->done;
    pthread_mutex_unlock(&eng->mu);
    if (!done) return set_error(EBUSY, "send still in flight; wait for it first");
    const struct txr *r = &s->r[i];
    memset(out, 0, sizeof *out);
    out->result = r->result;
    out->datagrams_sent = r->report.sent;
    out->datagrams_retransmitted = r->report.retrans;
    out->datagrams_received = r->report.peer_total;
    out->passes = r->report.passes;
    uint32_t got = r->report.peer_chunks > r->acked.count ? r->report.peer_chunks : r->acked.count;
    out->delivered = s->nchunks ? (double)got / s->nchunks : 1.0;
    uint64_t end = r->report.done_ns ? r->report.done_ns : now_ns();
    out->elapsed_s = (double)(end - s->start_ns) / 1e9;
    /* What reached the receiver, retransmissions included: random loss leaves it near the paced
     * rate, while a link slower than the pacing caps it (what bandwidth estimates need). */
    double arrived = (double)r->report.peer_total * s->chunk;
    out->delivery_rate = out->elapsed_s > 0 ? arrived / out->elapsed_s : 0;
    /* Datagrams the receiver counted between its first and latest first-pass replies, over the time
     * between them, in wire bytes (as pacing and link rates count them). */
    uint32_t spread = r->arrivals.last_total - r->arrivals.first_total;
    double dgram = (double)(WIRE_HDR + s->chunk + WIRE_OVERHEAD);
    int slow = r->result == P2P_SEND_SLOW;
    /* slow: the rate it was closed on, up to the close */
    uint64_t until = slow ? r->report.close_ns : r->arrivals.last_ns;
    if (spread >= ACK_RATE_MIN_DGRAMS && until > r->arrivals.first_ns)
        out->ack_rate = (double)spread * dgram / ((double)(until - r->arrivals.first_ns) / 1e9);
    else if (slow && out->elapsed_s > 0) /* too few ACKs to time: what it received over the send */
        out->ack_rate = (double)r->report.peer_total * dgram / out->elapsed_s;
    out->loss_rate = r->report.sent ? 1.0 - (double)r->report.peer_total / (double)r->report.sent : 0;
    if (out->loss_rate < 0) out->loss_rate = 0;
    out->rtt_s = (double)r->timer.srtt_ns / 1e9;
    out->error = r->report.error;
    out->multicast = r->report.reached;
    if (fractions && nseg) {
        uint64_t *cov = malloc(sizeof(uint64_t) * nseg), *off = malloc(sizeof(uint64_t) * nseg);
        if (!cov || !off) { free(cov); free(off); return set_error(ENOMEM, "out of memory"); }
        for (uint32_t j = 0; j < nseg; j++) off[j] = s->seg_flat[j] - s->meta_len;
        segment_coverage(r->acked.chunks, s->nchunks, s->chunk, s->meta_len, off, s->seg_len, nseg, cov);
        for (uint32_t j = 0; j < nseg; j++) fractions[j] = s->seg_len[j] ? (double)cov[j] / (double)s->seg_len[j] : 1.0;
        free(cov);
        free(off);
    }
    return 0;
}

void p2p_send_release(p2p_send *s) {
    if (s) send_unref(s);
}
