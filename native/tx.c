/* Sending: each message to each of its receivers is paced, sent in passes (the first sends every
 * chunk, later ones what the receiver's ACKs say is missing and its loss bound still needs), probed,
 * and closed once every segment is within its bound, at the deadline, when its arrivals fall too far
 * behind its planned time (slow close), or when the receiver is gone.
 * Receivers asked for multicast are first told to join this sender's group (JOIN); while they
 * follow it, the group's passes (one datagram for all) stand for theirs, and each member is still
 * probed, acknowledged and closed on its own (see "the group" below). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "io.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

#define MAX_DGRAMS 256            /* datagrams per sendmmsg */
#define MAX_MSGS 64
#define MAX_GSO_SEGS 64
#define MAX_GSO_BYTES 65000
#define PIECES 6                  /* iovecs per datagram before gathering into a staging copy */
#define STAGE_SLOTS 64
#define RTO_MIN_NS 5000000ull
#define RTO_MAX_NS 1000000000ull
#define UNREACHABLE_NS 3000000000ull
#define CLOSE_TRIES 10
#define JOIN_TRIES 3              /* unanswered JOINs before the receiver gets the message by unicast */
#define ANSWER_TRIES 3            /* unanswered group probes before a silent member stops holding up the group */
/* ... and silent this long (no ACK at all): a member on a busy host (its I/O thread waiting for a
 * core) falls silent for tens of ms and must not be sent a whole message again by unicast for it. */
#define MEMBER_SILENT_NS 500000000ull

static const uint8_t zeros[8];

static void tx_hdr(const struct p2p_send *s, uint8_t type, struct wire_hdr *h) {
    memset(h, 0, sizeof *h);
    h->type = type;
    h->msg = s->msg;
    h->nchunks = s->nchunks;
    h->chunk_size = s->chunk;
    h->meta_len = s->meta_len;
}

static void send_probe(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    uint8_t body[PROBE_BODY];
    tx_hdr(s, T_PROBE, &h);
    wire_put_probe(body, r->pass);
    dgram_send_ctl(eng, &r->addr, &h, body, sizeof body);
    r->probe_ns = now;
}

static void send_join(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    uint8_t body[JOIN_BODY];
    struct join_body j = {s->group->addr.sin_addr.s_addr, ntohs(s->group->addr.sin_port)};
    tx_hdr(s, T_JOIN, &h);
    wire_put_join(body, &j);
    dgram_send_ctl(eng, &r->addr, &h, body, sizeof body);
    r->probe_ns = now;
}

static void group_check(p2p_engine *eng, struct p2p_send *s, uint64_t now);

static void send_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    tx_hdr(s, T_CLOSE, &h);
    dgram_send_ctl(eng, &r->addr, &h, NULL, 0);
    r->probe_ns = now;
}

/* ---- sender ---- */

static void complete_send(p2p_engine *eng, struct p2p_send *s) {
    pthread_mutex_lock(&eng->mu);
    s->done = 1;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}

static void finish(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now) {
    if (r->state == S_DONE) return;
    r->state = S_DONE;
    r->result = result;
    r->done_ns = now;
    if (result == P2P_SEND_SLOW) CNT(eng, slow_closed, 1);
    if (--s->nactive == 0) complete_send(eng, s);
    if (r->follows) {
        r->follows = 0;
        group_check(eng, s, now);
    }
}

static int close_ok(const struct p2p_send *s, const struct txr *r) {
    return r->first_pass_done && r->meta_acked == s->meta_chunks && r->nseg_ok == s->nseg;
}

/* A member closed as slow no longer sets the group's pace: the slowest paced member still following
 * does (the group was paced at the slowest of all, see init_group). */
static void group_repace(struct p2p_send *s) {
    double pace = 0;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        const struct txr *m = &s->r[i];
        if (m->follows && m->rate > 0 && (pace == 0 || m->rate < pace)) pace = m->rate;
    }
    if (pace > 0) s->group->rate = pace;
}

static void start_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now) {
    r->state = S_CLOSE;
    r->result = result;
    r->close_ns = now;
    r->tries = 0;
    r->rto_ns = r->srtt_ns ? 3 * r->srtt_ns + RTO_MIN_NS : 50000000ull;
    send_close(eng, s, r, now);
    if (r->follows) {
        r->follows = 0;
        if (result == P2P_SEND_SLOW) group_repace(s);
        group_check(eng, s, now);
    }
}

/* Datagrams of the first pass that the receiver must have counted before its arrival rate is
 * judged: 1/16 of the message, and at least two ACK intervals (a rate from one is noise). */
static uint32_t slow_sample(const struct p2p_send *s) {
    uint32_t n = s->nchunks / 16;
    return n > ACK_RATE_MIN_DGRAMS ? n : ACK_RATE_MIN_DGRAMS;
}

/* Whether the receiver holds the message, so that a CLOSE delivers what arrived: it acknowledged a
 * chunk of it, or (a member) its JOIN opened it there. A CLOSE before that finds no message and
 * delivers nothing (rx_on_probe_or_close): the receiver would wait for one that never comes. So a
 * flow past its slow-close limit that has not been heard of yet (a message planned shorter than the
 * pacer's first wake-up, a late I/O thread, a first pass lost) goes on until it is, then closes. */
static int holds_message(const struct txr *r) {
    return r->nacked > 0 || r->follows;
}

/* Slow close (p2p_send_options.slow_factor): past the limit (start + S x planned time), or, in the
 * first pass, once the arrivals measured so far (datagrams the receiver counted since its first
 * reply, over the time since) project the end past it: what its bounds still need, at that rate.
 * Measured up to now, not to the latest reply, so a receiver whose arrivals stall projects ever later. */
static int slow_due(const struct p2p_send *s, const struct txr *r, uint64_t now) {
    if (!r->slow_ns) return 0;
    if (now >= r->slow_ns) return holds_message(r);
    uint32_t counted = r->ack_last_total - r->ack_first_total;
    if (r->pass != 0 || counted < slow_sample(s) || now <= r->ack_first_ns) return 0;
    double left = (double)(s->meta_chunks - r->meta_acked) + (double)r->need_left / s->chunk;
    double ns_per_dgram = (double)(now - r->ack_first_ns) / counted;
    return (double)now + left * ns_per_dgram > (double)r->slow_ns;
}

static void close_if_ok(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_SEND || r->state == S_PROBE) {
        if (close_ok(s, r))
            start_close(eng, s, r, r->nacked == s->nchunks ? P2P_SEND_EXACT : P2P_SEND_EARLY_CLOSED, now);
        else if (s->deadline_ns && now >= s->deadline_ns)
            start_close(eng, s, r, P2P_SEND_DEADLINE, now);
        else if (slow_due(s, r, now))
            start_close(eng, s, r, P2P_SEND_SLOW, now);
    }
}

static void mark_acked(struct p2p_send *s, struct txr *r, uint32_t k) {
    if (BIT_GET(r->acked, k)) return;
    BIT_SET(r->acked, k);
    r->nacked++;
    if (k < s->meta_chunks) r->meta_acked++;
    uint64_t a = (uint64_t)k * s->chunk, b = a + s->chunk;
    for (uint32_t i = s->chunk_seg[k]; i < s->nseg && s->seg_flat[i] < b; i++) {
        uint64_t lo = a > s->seg_flat[i] ? a : s->seg_flat[i];
        uint64_t end = s->seg_flat[i] + s->seg_len[i];
        uint64_t hi = b < end ? b : end;
        if (hi <= lo) continue;
        if (!r->seg_ok[i]) {
            uint64_t gap = s->seg_need[i] - r->seg_acked[i];
            r->need_left -= hi - lo < gap ? hi - lo : gap;
        }
        r->seg_acked[i] += hi - lo;
        if (!r->seg_ok[i] && r->seg_acked[i] >= s->seg_need[i]) {
            r->seg_ok[i] = 1;
            r->nseg_ok++;
        }
    }
}

/* Starts the next pass: the missing meta chunks, and for each segment short of its bound as many
 * of its missing chunks as its deficit needs, padded for the loss this pass measured. Segments
 * already within their bound get nothing: that is the point of tolerating loss. */
static int next_pass(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    uint32_t missing = s->nchunks - r->nacked;
    double loss = r->plen ? 1.0 - (double)r->peer_count / (double)r->plen : 0;
    double pad = 1.0 + 2.0 * (loss < 0 ? 0 : loss > 0.5 ? 0.5 : loss);
    int64_t *budget = malloc(sizeof(int64_t) * (s->nseg + 1));
    free(r->plist);
    r->plist = malloc(sizeof(uint32_t) * (missing + 1));
    if (!r->plist || !budget) {
        free(budget);
        finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return -1;
    }
    for (uint32_t i = 0; i < s->nseg; i++)
        budget[i] = r->seg_ok[i] ? 0 : (int64_t)((double)(s->seg_need[i] - r->seg_acked[i]) * pad) + s->chunk;
    uint32_t n = 0;
    for (uint32_t k = 0; k < s->nchunks && n < missing; k++) {
        if (BIT_GET(r->acked, k)) continue;
        int take = k < s->meta_chunks;
        uint64_t a = (uint64_t)k * s->chunk, b = a + s->chunk;
        for (uint32_t i = s->chunk_seg[k]; i < s->nseg && s->seg_flat[i] < b; i++) {
            if (budget[i] <= 0) continue;
            uint64_t lo = a > s->seg_flat[i] ? a : s->seg_flat[i];
            uint64_t end = s->seg_flat[i] + s->seg_len[i], hi = b < end ? b : end;
            if (hi > lo) { budget[i] -= (int64_t)(hi - lo); take = 1; }
        }
        if (take) r->plist[n++] = k;
    }
    free(budget);
    r->plen = n;
    r->ppos = 0;
    r->pass++;
    r->passes++;
    r->peer_high = r->peer_count = 0;
    r->state = S_SEND;
    r->last_ack_ns = now;
    if (n == 0) { /* nothing worth resending (cannot happen while a bound is unmet): ask again */
        r->state = S_PROBE;
        send_probe(eng, s, r, now);
    }
    return 0;
}

/* Pass entries below chunk index `high`: what the receiver has seen or lost, no longer in flight. */
static uint32_t pass_entries_below(const struct txr *r, uint32_t high) {
    if (!r->plist) return high < r->plen ? high : r->plen;
    uint32_t lo = 0, hi = r->plen;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r->plist[mid] < high) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static uint32_t window_chunks(const p2p_engine *eng, const struct p2p_send *s) {
    uint32_t w = eng->cfg.window_bytes / s->chunk;
    return w < 16 ? 16 : w;
}

static int window_open(const p2p_engine *eng, const struct p2p_send *s, const struct txr *r) {
    uint32_t below = pass_entries_below(r, r->peer_high);
    return r->ppos < below || r->ppos - below < window_chunks(eng, s);
}

/* Bucket depth: about 2 ms at the rate, so late wake-ups lose no tokens, but at most 32 KB so a
 * shallow switch queue is not overrun; never below a few datagrams. */
static double burst_of(double rate, double dgram) {
    double b = rate * 0.002;
    if (b > 32 * 1024) b = 32 * 1024;
    return b < 4 * dgram ? 4 * dgram : b;
}

static void refill(double *tokens, uint64_t *at, double rate, double dgram, uint64_t now) {
    *tokens += rate * (double)(now - *at) / 1e9;
    double cap = burst_of(rate, dgram);
    if (*tokens > cap) *tokens = cap;
    *at = now;
}

/* Nanoseconds until `need` tokens are there (0 = now). */
static uint64_t token_wait(double tokens, double rate, double need) {
    if (tokens >= need || rate <= 0) return 0;
    return (uint64_t)((need - tokens) / rate * 1e9) + 1000;
}

static uint32_t chunk_len(const struct p2p_send *s, uint32_t k) {
    uint64_t a = (uint64_t)k * s->chunk;
    uint64_t left = s->total - a;
    return left < s->chunk ? (uint32_t)left : s->chunk;
}

/* The pieces of chunk k in place: meta, segment memory and alignment padding. With `copy_to` set,
 * copies them there instead. Returns the piece count, or -1 when more than `max` are needed. */
static int gather(const struct p2p_send *s, uint32_t k, struct iovec *iov, int max, uint8_t *copy_to) {
    uint64_t pos = (uint64_t)k * s->chunk, end = pos + chunk_len(s, k);
    int n = 0;
#define PIECE(p, l)                                                                    \
    do {                                                                               \
        if (copy_to) { memcpy(copy_to, (p), (l)); copy_to += (l); }                    \
        else { if (n == max) return -1; iov[n].iov_base = (void *)(p); iov[n].iov_len = (l); } \
        n++;                                                                           \
    } while (0)
    if (pos < s->meta_len) {
        uint64_t hi = end < s->meta_len ? end : s->meta_len;
        PIECE(s->meta + pos, hi - pos);
        pos = hi;
    }
    for (uint32_t i = s->chunk_seg[k]; i < s->nseg && pos < end; i++) {
        if (s->seg_flat[i] > pos) {
            PIECE(zeros, s->seg_flat[i] - pos);
            pos = s->seg_flat[i];
        }
        uint64_t segend = s->seg_flat[i] + s->seg_len[i];
        uint64_t hi = end < segend ? end : segend;
        if (hi > pos) {
            PIECE(s->seg_ptr[i] + (pos - s->seg_flat[i]), hi - pos);
            pos = hi;
        }
    }
#undef PIECE
    return n;
}

/* ---- the group (IP multicast) ----
 * Members follow the group from their JOIN's answer on: the group sends each pass once (paced at
 * the slowest member's rate, its window held by the member furthest behind), then probes every
 * member; when all answered, the next pass goes to the group while on average each chunk resent
 * serves two members or more (shared loss: the sender's queue, its uplink), else each member
 * repairs by unicast (independent loss: a chunk resent to the group would mostly reach members
 * that have it). A member that hears nothing through the group, or stops answering, goes on by
 * unicast alone; so does one whose JOIN is refused or unanswered. */

/* A member leaves the group for unicast, taking on from what it acknowledged. */
static void leave_for_unicast(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    r->follows = 0;
    r->first_pass_done = 1; /* its next pass sends whatever it lacks, sent by the group or not */
    next_pass(eng, s, r, now);
}

/* Every member goes on by unicast; the group is done. */
static void dissolve(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    s->group->state = S_DONE;
    for (uint32_t i = 0; i < s->nrcv; i++)
        if (s->r[i].follows) leave_for_unicast(eng, s, &s->r[i], now);
}

/* The group's pass went out: every member is asked for its bitmap. */
static void group_pass_sent(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    g->state = S_PROBE;
    g->rto_ns = RTO_MIN_NS;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->follows) continue;
        if (r->rto_ns > g->rto_ns) g->rto_ns = r->rto_ns; /* the slowest member's answer */
        r->plen = g->plen; /* the pass it took part in: next_pass measures its loss on it */
        r->sent += g->plen;
        if (g->pass) r->retrans += g->plen;
        else r->first_pass_done = 1;
        r->state = S_PROBE;
        r->answered = 0;
        r->tries = 0;
        r->probe_ns = now;
    }
    /* One probe through the group: behind the pass's data in each member's multicast socket (one
     * sent by unicast could overtake data still queued there and be answered too soon). */
    send_probe(eng, s, g, now);
}

/* Every member answered: each one's next pass (what its bounds still need), and whether they go to
 * the group as one pass (their union) or to each member by unicast. */
static void group_next_pass(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    uint8_t *want = calloc(1, (s->nchunks + 7) / 8 + 1);
    if (!want) { dissolve(eng, s, now); return; }
    g->state = S_CLOSE; /* deciding: members that end meanwhile do not start this again */
    uint64_t members = 0, sum = 0, n = 0;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->follows) continue;
        next_pass(eng, s, r, now);
        if (!r->follows) continue; /* it ended (out of memory) */
        if (r->state != S_SEND) { r->follows = 0; continue; } /* nothing to resend: it probes on its own */
        members++;
        sum += r->plen;
        for (uint32_t j = 0; j < r->plen; j++)
            if (!BIT_GET(want, r->plist[j])) { BIT_SET(want, r->plist[j]); n++; }
    }
    free(g->plist);
    g->plist = members >= 2 && sum >= 2 * n ? malloc(sizeof(uint32_t) * (n + 1)) : NULL;
    if (!g->plist) { /* each member sends the pass it has by unicast */
        free(want);
        g->state = S_DONE;
        for (uint32_t i = 0; i < s->nrcv; i++) s->r[i].follows = 0;
        return;
    }
    g->plen = 0;
    for (uint32_t k = 0; k < s->nchunks; k++)
        if (BIT_GET(want, k)) g->plist[g->plen++] = k;
    free(want);
    g->ppos = 0;
    g->pass++; /* as each member's next_pass did */
    g->passes++;
    g->peer_high = 0;
    g->state = S_SEND;
    g->last_ack_ns = now;
}

/* After a member's state changed: the group's window (the member furthest behind), its start once
 * every member answered its JOIN, its next pass once every member answered its probe, its end. */
static void group_check(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    if (!g || g->state == S_DONE) return;
    uint32_t members = 0, joining = 0, waiting = 0, high = UINT32_MAX;
    uint64_t rto = RTO_MIN_NS;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        const struct txr *r = &s->r[i];
        if (!r->follows) continue;
        members++;
        joining += r->state == S_JOIN;
        waiting += r->state == S_PROBE && !r->answered;
        if (r->peer_high < high) high = r->peer_high;
        if (r->rto_ns > rto) rto = r->rto_ns;
    }
    if (!members) { g->state = S_DONE; return; }
    if (high > g->peer_high) { /* progress: the stall timer starts over */
        g->peer_high = high;
        g->last_ack_ns = now;
        g->rto_ns = rto;
    }
    if (g->state == S_JOIN && !joining) {
        g->state = S_SEND;
        g->refill_ns = g->last_ack_ns = now;
    } else if (g->state == S_PROBE && !waiting) {
        group_next_pass(eng, s, now);
    }
}

/* A member's ACK, after its bitmap was taken. A probe answer while a whole window is stalled that
 * shows nothing of it arrived means the group's data does not reach the member (its probes do).
 * Nothing of a pass that ended is no such sign: a member's first IGMP report goes out on a kernel
 * timer, after its answer to the JOIN, so a short first pass can pass by it before the switch
 * knows its port; that is repaired as any loss, through the group if others need it too. */
static void group_on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct ack_body *a, int final,
                         uint64_t now) {
    struct txr *g = s->group;
    if (a->pass_count) r->reached = 1;
    if (final && !a->pass_count && g->state == S_SEND && !window_open(eng, s, g))
        leave_for_unicast(eng, s, r, now);
    else if (final && r->state == S_PROBE)
        r->answered = 1;
    group_check(eng, s, now);
}

/* A stalled window, or members yet to answer the pass's probe: probe again, through the group so
 * that the probe stays behind the data (a member lagging behind a backlog answers late, not
 * wrongly). A member asked in vain ANSWER_TRIES times and silent meanwhile (a lagging one still
 * ACKs what it works through) goes on by unicast on its own; so does one the group never reaches
 * (that costs its first message MEMBER_SILENT_NS or so: "auto" mode probes for such peers first). */
static void group_timers(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    if (!g || (g->state != S_SEND && g->state != S_PROBE) || (g->state == S_SEND && window_open(eng, s, g)))
        return;
    uint64_t since = g->state == S_SEND ? now - g->last_ack_ns : now - g->probe_ns;
    if (since < g->rto_ns) return;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->follows || (g->state == S_PROBE && (r->state != S_PROBE || r->answered))) continue;
        uint64_t silent = now - r->last_heard_ns;
        if (++r->tries <= ANSWER_TRIES || silent <= g->rto_ns || silent <= MEMBER_SILENT_NS) continue;
        if (r->state == S_SEND) leave_for_unicast(eng, s, r, now); /* a fresh pass of what it lacks */
        else r->follows = 0; /* it probes on its own for the answer it owes */
    }
    g->rto_ns = g->rto_ns * 2 > RTO_MAX_NS ? RTO_MAX_NS : g->rto_ns * 2;
    g->last_ack_ns = now;
    send_probe(eng, s, g, now);
    group_check(eng, s, now); /* members that left may have been all it waited for */
}

struct batch {
    struct mmsghdr mm[MAX_MSGS];
    struct iovec iov[MAX_DGRAMS * (PIECES + 1)];
    uint8_t hdr[MAX_DGRAMS][WIRE_HDR];
    char cmsg[MAX_MSGS][CMSG_SPACE(sizeof(uint16_t))];
    int msg_dgrams[MAX_MSGS];
    uint16_t msg_size[MAX_MSGS];  /* GSO segment size: every datagram of the message has it */
};

int tx_init(p2p_engine *eng) {
    eng->batch = calloc(1, sizeof(struct batch));
    return eng->batch ? 0 : -1;
}

/* Sends up to `budget` datagrams of r's current pass; returns how many went out, -1 on EAGAIN. */
static int pump_receiver(p2p_engine *eng, struct p2p_send *s, struct txr *r, int budget, uint64_t now) {
    double dgram = (double)(WIRE_HDR + s->chunk + WIRE_OVERHEAD);
    if (r->rate > 0) refill(&r->tokens, &r->refill_ns, r->rate, dgram, now);
    if (eng->cfg.uplink_rate > 0) refill(&eng->up_tokens, &eng->up_refill_ns, eng->cfg.uplink_rate, dgram, now);

    struct batch *B = eng->batch;
    int nd = 0, nm = 0, niov = 0, staged = 0;
    uint32_t gso_size = 0, gso_bytes = 0;
    uint32_t start_pos = r->ppos;
    double spent = 0;
    while (nd < budget && nd < MAX_DGRAMS && r->ppos < r->plen && window_open(eng, s, r)) {
        uint32_t k = r->plist ? r->plist[r->ppos] : r->ppos;
        uint32_t len = chunk_len(s, k);
        double cost = (double)(WIRE_HDR + len + WIRE_OVERHEAD);
        if (r->rate > 0 && r->tokens < spent + cost) break;
        if (eng->cfg.uplink_rate > 0 && eng->up_tokens < spent + cost) break;
        struct iovec *iv = &B->iov[niov];
        int np = gather(s, k, iv + 1, PIECES, NULL);
        if (np < 0) {
            if (staged == STAGE_SLOTS) break;
            uint8_t *stage = eng->sbuf + (size_t)staged++ * 65536;
            gather(s, k, NULL, 0, stage);
            iv[1].iov_base = stage;
            iv[1].iov_len = len;
            np = 1;
        }
        struct wire_hdr h;
        tx_hdr(s, T_DATA, &h);
        h.sender = eng->cfg.sender_id;
        h.pass = r->pass;
        h.chunk = k;
        wire_put_hdr(B->hdr[nd], &h);
        struct auth_dest dest = {r->addr.sin_addr.s_addr, ntohs(r->addr.sin_port)};
        auth_seal(&eng->auth, r == s->group ? &eng->group_stream : &eng->auth.stream, &dest, B->hdr[nd], iv + 1, np);
        iv[0].iov_base = B->hdr[nd];
        iv[0].iov_len = WIRE_HDR;
        uint32_t size = WIRE_HDR + len;
        /* GSO: equal-size datagrams to one address go out as one super-datagram the kernel splits. */
        int join = eng->gso && nm > 0 && gso_size == size && B->msg_dgrams[nm - 1] < MAX_GSO_SEGS &&
                   gso_bytes + size <= MAX_GSO_BYTES;
        if (join) {
            struct msghdr *mh = &B->mm[nm - 1].msg_hdr;
            mh->msg_iovlen += (size_t)np + 1;
            B->msg_dgrams[nm - 1]++;
            gso_bytes += size;
        } else {
            if (nm == MAX_MSGS) break;
            struct msghdr *mh = &B->mm[nm].msg_hdr;
            memset(mh, 0, sizeof *mh);
            mh->msg_name = &r->addr;
            mh->msg_namelen = sizeof r->addr;
            mh->msg_iov = iv;
            mh->msg_iovlen = (size_t)np + 1;
            B->msg_size[nm] = (uint16_t)size;
            B->msg_dgrams[nm++] = 1;
            gso_size = size;
            gso_bytes = size;
        }
        niov += np + 1;
        spent += cost;
        nd++;
        r->ppos++;
    }
    if (nd == 0) return 0;
    for (int m = 0; m < nm; m++) {
        struct msghdr *mh = &B->mm[m].msg_hdr;
        if (B->msg_dgrams[m] < 2) continue;
        mh->msg_control = B->cmsg[m];
        mh->msg_controllen = sizeof B->cmsg[m];
        struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
        cm->cmsg_level = SOL_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        memcpy(CMSG_DATA(cm), &B->msg_size[m], sizeof(uint16_t));
    }
    int sent = sendmmsg(eng->fd, B->mm, (unsigned)nm, MSG_DONTWAIT);
    if (sent < 0 && eng->gso && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EOPNOTSUPP)) {
        eng->gso = 0; /* the path cannot segment: fall back to one datagram per message */
        r->ppos = start_pos;
        return 0;
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != EINTR) {
        /* The kernel refuses this destination (EACCES, ENETUNREACH, EPERM from a firewall, ...):
         * retrying cannot help, and waiting for the socket to be writable would spin and starve
         * every other receiver. This receiver ends; the others go on. */
        r->error = errno;
        r->ppos = start_pos;
        CNT(eng, send_errors, 1);
        if (r == s->group) dissolve(eng, s, now); /* no multicast route: every member by unicast */
        else finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return 0;
    }
    int dgrams = 0;
    uint64_t bytes = 0;
    for (int m = 0; m < (sent > 0 ? sent : 0); m++) {
        dgrams += B->msg_dgrams[m];
        for (size_t j = 0; j < B->mm[m].msg_hdr.msg_iovlen; j++) bytes += B->mm[m].msg_hdr.msg_iov[j].iov_len;
    }
    r->ppos = start_pos + (uint32_t)dgrams; /* what did not go out is sent next time */
    double paid = (double)bytes + (double)dgrams * WIRE_OVERHEAD;
    if (r->rate > 0) r->tokens -= paid;
    if (eng->cfg.uplink_rate > 0) eng->up_tokens -= paid;
    r->sent += (uint64_t)dgrams;
    if (r->pass > 0) {
        r->retrans += (uint64_t)dgrams;
        CNT(eng, retransmissions, dgrams);
    }
    CNT(eng, datagrams_sent, dgrams);
    CNT(eng, bytes_sent, bytes);
    if (r == s->group) CNT(eng, mcast_datagrams_sent, dgrams);
    if (r->ppos == r->plen && r == s->group) {
        group_pass_sent(eng, s, now);
    } else if (r->ppos == r->plen) {
        /* Pass done: ask for the receiver's bitmap; the probe queues behind the data. */
        if (r->pass == 0) r->first_pass_done = 1;
        r->state = S_PROBE;
        r->tries = 0;
        send_probe(eng, s, r, now);
    }
    if (sent < nm) return -1;
    return dgrams;
}

/* A first-pass reply saying the receiver has `total` datagrams of the message: the spread of these
 * over time is the rate at which datagrams reached it, whatever the pacing and whatever the close
 * handshake cost (a delivery-rate estimate from ACK arrivals). Later passes wait on probes first. */
static void note_arrivals(struct txr *r, uint32_t total, uint64_t now) {
    if (r->pass != 0 || total == 0) return;
    if (!r->ack_first_ns) {
        r->ack_first_ns = r->ack_last_ns = now;
        r->ack_first_total = r->ack_last_total = total;
    } else if (total > r->ack_last_total) {
        r->ack_last_ns = now;
        r->ack_last_total = total;
    }
}

static void on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct wire_hdr *h,
                   const uint8_t *body, size_t blen, uint64_t now) {
    struct ack_body a;
    if (blen < ACK_BODY) { CNT(eng, drop_bad_length, 1); return; }
    wire_get_ack(body, &a);
    if (a.start % 8 || a.start > s->nchunks || a.nbits > s->nchunks - a.start || a.pass_high > s->nchunks ||
        h->nchunks != s->nchunks) {
        CNT(eng, drop_bad_index, 1);
        return;
    }
    if (blen != ACK_BODY + (a.nbits + 7) / 8) { CNT(eng, drop_bad_length, 1); return; }
    r->last_heard_ns = now;
    if (r->state == S_DONE) return;
    if (a.flags & (ACK_JOINED | ACK_UNICAST)) { /* the answer to its JOIN */
        if (r->state != S_JOIN) return;
        r->srtt_ns = now - r->probe_ns;
        r->rto_ns = 3 * r->srtt_ns + RTO_MIN_NS;
        r->tries = 0;
        r->state = S_SEND; /* following the group, or by unicast from the start */
        r->last_ack_ns = now;
        if (a.flags & ACK_UNICAST) r->follows = 0;
        group_check(eng, s, now);
        return;
    }
    const uint8_t *bits = body + ACK_BODY;
    for (uint32_t byte = 0; byte < (a.nbits + 7) / 8; byte++) {
        uint8_t fresh = (uint8_t)(bits[byte] & ~r->acked[a.start / 8 + byte]);
        for (uint32_t b = 0; fresh; b++, fresh >>= 1)
            if ((fresh & 1) && byte * 8 + b < a.nbits) mark_acked(s, r, a.start + byte * 8 + b);
    }
    if (a.pass == r->pass) {
        if (a.pass_high > r->peer_high) r->peer_high = a.pass_high;
        if (a.pass_count > r->peer_count) r->peer_count = a.pass_count;
        r->last_ack_ns = now;
    }
    if (a.total > r->peer_total) r->peer_total = a.total;
    note_arrivals(r, a.total, now);
    int final = (a.flags & ACK_FINAL) && a.pass == r->pass;
    if (final) {
        uint64_t rtt = now - r->probe_ns;
        r->srtt_ns = r->srtt_ns ? (7 * r->srtt_ns + rtt) / 8 : rtt;
        r->rto_ns = 3 * r->srtt_ns + RTO_MIN_NS;
        if (r->rto_ns > RTO_MAX_NS) r->rto_ns = RTO_MAX_NS;
        r->tries = 0;
    }
    int probed = final && r->state == S_PROBE;
    close_if_ok(eng, s, r, now);
    if (r->follows) group_on_ack(eng, s, r, &a, final, now);
    else if (probed && r->state == S_PROBE) next_pass(eng, s, r, now);
}

static void on_done(p2p_engine *eng, struct p2p_send *s, struct txr *r, const uint8_t *body, size_t blen,
                    uint64_t now) {
    struct done_body d;
    if (blen != DONE_BODY) { CNT(eng, drop_bad_length, 1); return; }
    wire_get_done(body, &d);
    r->last_heard_ns = now;
    if (r->state == S_DONE) return;
    if (d.flags & DONE_COMPLETE)
        for (uint32_t k = 0; k < s->nchunks; k++) mark_acked(s, r, k);
    if (d.total > r->peer_total) r->peer_total = d.total;
    if (r->follows && d.total) r->reached = 1; /* all it got came through the group */
    note_arrivals(r, d.total, now);
    r->peer_chunks = d.chunks;
    int result = r->state == S_CLOSE ? r->result : P2P_SEND_EARLY_CLOSED;
    if (r->nacked == s->nchunks) result = P2P_SEND_EXACT;
    finish(eng, s, r, result, now);
}

static struct txr *find_txr(p2p_engine *eng, uint32_t msg, const struct sockaddr_in *from, struct p2p_send **sp) {
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        if (s->msg != msg) continue;
        for (uint32_t i = 0; i < s->nrcv; i++)
            if (s->r[i].state != S_DONE && same_addr(&s->r[i].addr, from)) {
                *sp = s;
                return &s->r[i];
            }
    }
    return NULL;
}

/* Timers of one receiver's send: deadline, slow-close limit, lost probes or CLOSEs, a stalled window. */
static void timers_of(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_DONE) return;
    if (r->state != S_CLOSE && s->deadline_ns && now >= s->deadline_ns) {
        start_close(eng, s, r, P2P_SEND_DEADLINE, now);
        return;
    }
    if (r->state != S_CLOSE && r->slow_ns && now >= r->slow_ns && holds_message(r)) {
        start_close(eng, s, r, P2P_SEND_SLOW, now);
        return;
    }
    if (now - r->last_heard_ns > UNREACHABLE_NS && r->tries >= 3) {
        finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return;
    }
    if (r->follows && (r->state == S_SEND || r->state == S_PROBE)) return; /* the group's timer watches it */
    uint64_t since = r->state == S_SEND ? now - r->last_ack_ns : now - r->probe_ns;
    if (since < r->rto_ns) return;
    if (r->state == S_SEND && window_open(eng, s, r)) return;
    r->tries++;
    r->rto_ns = r->rto_ns * 2 > RTO_MAX_NS ? RTO_MAX_NS : r->rto_ns * 2;
    if (r->state == S_CLOSE) {
        if (r->tries > CLOSE_TRIES) finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        else send_close(eng, s, r, now);
        return;
    }
    if (r->state == S_JOIN) {
        if (r->tries <= JOIN_TRIES) {
            send_join(eng, s, r, now);
            return;
        }
        r->follows = 0; /* by unicast from the start */
        r->state = S_SEND;
        group_check(eng, s, now);
        return;
    }
    send_probe(eng, s, r, now); /* lost probe answer, or a stalled window: ask where the receiver is */
    r->last_ack_ns = now;
}

static uint64_t next_wake_of(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    uint64_t wake = UINT64_MAX;
    if (r->state == S_DONE) return wake;
    if (s->deadline_ns && r->state != S_CLOSE) wake = s->deadline_ns;
    if (r->slow_ns && r->state != S_CLOSE && holds_message(r) && r->slow_ns < wake) wake = r->slow_ns;
    if (r->follows && (r->state == S_SEND || r->state == S_PROBE)) return wake; /* the group's timer watches it */
    int sending = r->state == S_SEND && r->ppos < r->plen && window_open(eng, s, r);
    if (!sending) { /* waiting for the receiver: its answer, or the retransmission timer (see tx_timers) */
        uint64_t t = (r->state == S_SEND ? r->last_ack_ns : r->probe_ns) + r->rto_ns;
        if (t < wake) wake = t;
    } else {
        /* Wake once half a bucket is there: one batch per wake-up, not one datagram. */
        double dgram = (double)(WIRE_HDR + s->chunk + WIRE_OVERHEAD);
        uint64_t w = token_wait(r->tokens, r->rate, burst_of(r->rate, dgram) / 2);
        double up = eng->cfg.uplink_rate;
        uint64_t u = up > 0 ? token_wait(eng->up_tokens, up, burst_of(up, dgram) / 2) : 0;
        uint64_t t = now + (w > u ? w : u);
        if (t < wake) wake = t;
    }
    return wake;
}

void tx_take_commands(p2p_engine *eng, uint64_t now) {
    pthread_mutex_lock(&eng->mu);
    struct p2p_send *s = eng->cmd_head;
    eng->cmd_head = eng->cmd_tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    while (s) {
        struct p2p_send *next = s->next;
        for (uint32_t i = 0; i < s->nrcv; i++) {
            struct txr *r = &s->r[i];
            struct p2p_send *other;
            r->refill_ns = r->last_ack_ns = r->last_heard_ns = now;
            if (find_txr(eng, s->msg, &r->addr, &other)) finish(eng, s, r, P2P_SEND_DUPLICATE, now);
            else if (r->follows) send_join(eng, s, r, now);
        }
        s->next = eng->active;
        eng->active = s;
        if (s->nrcv == 0) complete_send(eng, s);
        s = next;
    }
    eng->up_refill_ns = eng->up_refill_ns ? eng->up_refill_ns : now;
}

void tx_on_reply(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *body,
                 size_t blen, uint64_t now) {
    struct p2p_send *s;
    struct txr *r = find_txr(eng, h->msg, src, &s);
    if (!r) { CNT(eng, drop_unknown, 1); return; }
    if (h->type == T_ACK) on_ack(eng, s, r, h, body, blen, now);
    else on_done(eng, s, r, body, blen, now);
}

void tx_timers(p2p_engine *eng, uint64_t now) {
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        for (uint32_t i = 0; i < s->nrcv; i++) timers_of(eng, s, &s->r[i], now);
        group_timers(eng, s, now);
    }
}

/* The earliest of `wake` and the time any send next has something to do. */
uint64_t tx_next_wake(p2p_engine *eng, uint64_t now, uint64_t wake) {
    for (struct p2p_send *s = eng->active; s; s = s->next)
        for (uint32_t i = 0; i <= s->nrcv; i++) { /* the receivers, then the group */
            struct txr *r = i < s->nrcv ? &s->r[i] : s->group;
            if (!r || (r == s->group && r->state != S_SEND && r->state != S_PROBE)) continue;
            uint64_t t = next_wake_of(eng, s, r, now);
            if (t < wake) wake = t;
        }
    return wake;
}

/* After the I/O thread stopped: every send, queued or active, ends as cancelled. */
void tx_cancel_all(p2p_engine *eng, uint64_t now) {
    tx_take_commands(eng, now);
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        for (uint32_t i = 0; i < s->nrcv; i++) finish(eng, s, &s->r[i], P2P_SEND_CANCELLED, now);
        if (s->nrcv == 0) complete_send(eng, s);
    }
    tx_reap(eng);
}

/* Removes finished sends from the active list, dropping the I/O thread's reference. */
void tx_reap(p2p_engine *eng) {
    for (struct p2p_send **pp = &eng->active; *pp;) {
        struct p2p_send *s = *pp;
        if (s->nactive == 0) {
            *pp = s->next;
            send_unref(s);
        } else {
            pp = &s->next;
        }
    }
}

/* Sends what pacing and windows allow, round-robin over receivers and groups. Returns 1 if more is ready now. */
int tx_pump(p2p_engine *eng, uint64_t now) {
    int budget = 1024, progress = 1;
    while (budget > 0 && progress) {
        progress = 0;
        for (struct p2p_send *s = eng->active; s && budget > 0; s = s->next)
            for (uint32_t i = 0; i <= s->nrcv && budget > 0; i++) { /* the receivers, then the group */
                struct txr *r = i < s->nrcv ? &s->r[i] : s->group;
                if (!r || r->follows || r->state != S_SEND || r->ppos >= r->plen) continue;
                int n = pump_receiver(eng, s, r, 64, now);
                if (n < 0) {
                    eng->want_out = 1; /* socket buffer full: wait until writable */
                    return 0;
                }
                budget -= n;
                progress |= n > 0;
            }
    }
    return budget <= 0;
}
