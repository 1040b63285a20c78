/* One receiver's send of a message: paced, sent in passes (the first sends every chunk, later ones
 * what the receiver's ACKs say is missing and its loss bound still needs), probed, and closed once
 * every segment is within its bound, at the deadline, when its arrivals fall too far behind its
 * planned time (slow close), or when the receiver is gone.
 * States (enum tx_state): JOIN (a member waiting for its JOIN's answer) -> SEND (a pass going out)
 * <-> PROBE (the pass is out: waiting for the receiver's bitmap) -> CLOSE (CLOSE sent: waiting for
 * its DONE) -> DONE. While a member follows its group, the group's passes stand for its own
 * (group.c); it is still probed, acknowledged and closed here, on its own.
 * Tuning: RTO_MIN_NS/RTO_MAX_NS (tx.h) bound the retransmission timer, 3 x smoothed RTT plus the
 * minimum; CLOSE_TRIES and JOIN_TRIES how long a silent receiver is asked. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdlib.h>

#include "tx.h"

#define UNREACHABLE_NS 3000000000ull
#define CLOSE_TRIES 10
#define JOIN_TRIES 3              /* unanswered JOINs before the receiver gets the message by unicast */

void txr_send_probe(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    uint8_t body[PROBE_BODY];
    send_hdr(s, T_PROBE, &h);
    wire_put_probe(body, r->pass.index);
    dgram_send_ctl(eng, &r->addr, &h, body, sizeof body);
    r->timer.probe_ns = now;
}

void txr_send_join(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    uint8_t body[JOIN_BODY];
    struct join_body j = {s->group->addr.sin_addr.s_addr, ntohs(s->group->addr.sin_port)};
    send_hdr(s, T_JOIN, &h);
    wire_put_join(body, &j);
    dgram_send_ctl(eng, &r->addr, &h, body, sizeof body);
    r->timer.probe_ns = now;
}

static void send_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    send_hdr(s, T_CLOSE, &h);
    dgram_send_ctl(eng, &r->addr, &h, NULL, 0);
    r->timer.probe_ns = now;
}

void txr_finish(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now) {
    if (r->state == S_DONE) return;
    r->state = S_DONE;
    r->result = result;
    r->report.done_ns = now;
    if (result == P2P_SEND_SLOW) CNT(eng, slow_closed, 1);
    if (--s->nactive == 0) send_complete(eng, s);
    if (r->member.follows) {
        r->member.follows = 0;
        group_check(eng, s, now);
    }
}

static int close_ok(const struct p2p_send *s, const struct txr *r) {
    return r->pass.first_done && r->acked.meta == s->meta_chunks && r->acked.nseg_ok == s->nseg;
}

static void start_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now) {
    r->state = S_CLOSE;
    r->result = result;
    r->report.close_ns = now;
    r->timer.tries = 0;
    r->timer.rto_ns = r->timer.srtt_ns ? 3 * r->timer.srtt_ns + RTO_MIN_NS : 50000000ull;
    send_close(eng, s, r, now);
    if (r->member.follows) {
        r->member.follows = 0;
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
    return r->acked.count > 0 || r->member.follows;
}

/* Slow close (p2p_send_options.slow_factor): past the limit (start + S x planned time), or, in the
 * first pass, once the arrivals measured so far (datagrams the receiver counted since its first
 * reply, over the time since) project the end past it: what its bounds still need, at that rate.
 * Measured up to now, not to the latest reply, so a receiver whose arrivals stall projects ever later. */
static int slow_due(const struct p2p_send *s, const struct txr *r, uint64_t now) {
    if (!r->timer.slow_ns) return 0;
    if (now >= r->timer.slow_ns) return holds_message(r);
    uint32_t counted = r->arrivals.last_total - r->arrivals.first_total;
    if (r->pass.index != 0 || counted < slow_sample(s) || now <= r->arrivals.first_ns) return 0;
    double left = (double)(s->meta_chunks - r->acked.meta) + (double)r->acked.need_left / s->chunk;
    double ns_per_dgram = (double)(now - r->arrivals.first_ns) / counted;
    return (double)now + left * ns_per_dgram > (double)r->timer.slow_ns;
}

static void close_if_ok(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_SEND || r->state == S_PROBE) {
        if (close_ok(s, r))
            start_close(eng, s, r, r->acked.count == s->nchunks ? P2P_SEND_EXACT : P2P_SEND_EARLY_CLOSED, now);
        else if (s->deadline_ns && now >= s->deadline_ns)
            start_close(eng, s, r, P2P_SEND_DEADLINE, now);
        else if (slow_due(s, r, now))
            start_close(eng, s, r, P2P_SEND_SLOW, now);
    }
}

static void mark_acked(struct p2p_send *s, struct txr *r, uint32_t k) {
    if (BIT_GET(r->acked.chunks, k)) return;
    BIT_SET(r->acked.chunks, k);
    r->acked.count++;
    if (k < s->meta_chunks) r->acked.meta++;
    uint64_t a = (uint64_t)k * s->chunk, b = a + s->chunk;
    for (uint32_t i = s->chunk_seg[k]; i < s->nseg && s->seg_flat[i] < b; i++) {
        uint64_t lo = a > s->seg_flat[i] ? a : s->seg_flat[i];
        uint64_t end = s->seg_flat[i] + s->seg_len[i];
        uint64_t hi = b < end ? b : end;
        if (hi <= lo) continue;
        if (!r->acked.seg_ok[i]) {
            uint64_t gap = s->seg_need[i] - r->acked.seg_bytes[i];
            r->acked.need_left -= hi - lo < gap ? hi - lo : gap;
        }
        r->acked.seg_bytes[i] += hi - lo;
        if (!r->acked.seg_ok[i] && r->acked.seg_bytes[i] >= s->seg_need[i]) {
            r->acked.seg_ok[i] = 1;
            r->acked.nseg_ok++;
        }
    }
}

/* Starts the next pass: the missing meta chunks, and for each segment short of its bound as many
 * of its missing chunks as its deficit needs, padded for the loss this pass measured. Segments
 * already within their bound get nothing: that is the point of tolerating loss. */
int txr_next_pass(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    uint32_t missing = s->nchunks - r->acked.count;
    double loss = r->pass.len ? 1.0 - (double)r->pass.peer_count / (double)r->pass.len : 0;
    double pad = 1.0 + 2.0 * (loss < 0 ? 0 : loss > 0.5 ? 0.5 : loss);
    int64_t *budget = malloc(sizeof(int64_t) * (s->nseg + 1));
    free(r->pass.list);
    r->pass.list = malloc(sizeof(uint32_t) * (missing + 1));
    if (!r->pass.list || !budget) {
        free(budget);
        txr_finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return -1;
    }
    for (uint32_t i = 0; i < s->nseg; i++)
        budget[i] = r->acked.seg_ok[i] ? 0
                                       : (int64_t)((double)(s->seg_need[i] - r->acked.seg_bytes[i]) * pad) + s->chunk;
    uint32_t n = 0;
    for (uint32_t k = 0; k < s->nchunks && n < missing; k++) {
        if (BIT_GET(r->acked.chunks, k)) continue;
        int take = k < s->meta_chunks;
        uint64_t a = (uint64_t)k * s->chunk, b = a + s->chunk;
        for (uint32_t i = s->chunk_seg[k]; i < s->nseg && s->seg_flat[i] < b; i++) {
            if (budget[i] <= 0) continue;
            uint64_t lo = a > s->seg_flat[i] ? a : s->seg_flat[i];
            uint64_t end = s->seg_flat[i] + s->seg_len[i], hi = b < end ? b : end;
            if (hi > lo) { budget[i] -= (int64_t)(hi - lo); take = 1; }
        }
        if (take) r->pass.list[n++] = k;
    }
    free(budget);
    r->pass.len = n;
    r->pass.pos = 0;
    r->pass.index++;
    r->report.passes++;
    r->pass.peer_high = r->pass.peer_count = 0;
    r->state = S_SEND;
    r->timer.last_ack_ns = now;
    if (n == 0) { /* nothing worth resending (cannot happen while a bound is unmet): ask again */
        r->state = S_PROBE;
        txr_send_probe(eng, s, r, now);
    }
    return 0;
}

/* Pass entries below chunk index `high`: what the receiver has seen or lost, no longer in flight. */
static uint32_t pass_entries_below(const struct txr *r, uint32_t high) {
    if (!r->pass.list) return high < r->pass.len ? high : r->pass.len;
    uint32_t lo = 0, hi = r->pass.len;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r->pass.list[mid] < high) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static uint32_t window_chunks(const p2p_engine *eng, const struct p2p_send *s) {
    uint32_t w = eng->cfg.window_bytes / s->chunk;
    return w < 16 ? 16 : w;
}

int txr_window_open(const p2p_engine *eng, const struct p2p_send *s, const struct txr *r) {
    uint32_t below = pass_entries_below(r, r->pass.peer_high);
    return r->pass.pos < below || r->pass.pos - below < window_chunks(eng, s);
}

/* A first-pass reply saying the receiver has `total` datagrams of the message: the spread of these
 * over time is the rate at which datagrams reached it, whatever the pacing and whatever the close
 * handshake cost (a delivery-rate estimate from ACK arrivals). Later passes wait on probes first. */
static void note_arrivals(struct txr *r, uint32_t total, uint64_t now) {
    if (r->pass.index != 0 || total == 0) return;
    if (!r->arrivals.first_ns) {
        r->arrivals.first_ns = r->arrivals.last_ns = now;
        r->arrivals.first_total = r->arrivals.last_total = total;
    } else if (total > r->arrivals.last_total) {
        r->arrivals.last_ns = now;
        r->arrivals.last_total = total;
    }
}

void txr_on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct wire_hdr *h,
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
    r->timer.last_heard_ns = now;
    if (r->state == S_DONE) return;
    if (a.flags & (ACK_JOINED | ACK_UNICAST)) { /* the answer to its JOIN */
        if (r->state != S_JOIN) return;
        r->timer.srtt_ns = now - r->timer.probe_ns;
        r->timer.rto_ns = 3 * r->timer.srtt_ns + RTO_MIN_NS;
        r->timer.tries = 0;
        r->state = S_SEND; /* following the group, or by unicast from the start */
        r->timer.last_ack_ns = now;
        if (a.flags & ACK_UNICAST) r->member.follows = 0;
        group_check(eng, s, now);
        return;
    }
    const uint8_t *bits = body + ACK_BODY;
    for (uint32_t byte = 0; byte < (a.nbits + 7) / 8; byte++) {
        uint8_t fresh = (uint8_t)(bits[byte] & ~r->acked.chunks[a.start / 8 + byte]);
        for (uint32_t b = 0; fresh; b++, fresh >>= 1)
            if ((fresh & 1) && byte * 8 + b < a.nbits) mark_acked(s, r, a.start + byte * 8 + b);
    }
    if (a.pass == r->pass.index) {
        if (a.pass_high > r->pass.peer_high) r->pass.peer_high = a.pass_high;
        if (a.pass_count > r->pass.peer_count) r->pass.peer_count = a.pass_count;
        r->timer.last_ack_ns = now;
    }
    if (a.total > r->report.peer_total) r->report.peer_total = a.total;
    note_arrivals(r, a.total, now);
    int final = (a.flags & ACK_FINAL) && a.pass == r->pass.index;
    if (final) {
        uint64_t rtt = now - r->timer.probe_ns;
        r->timer.srtt_ns = r->timer.srtt_ns ? (7 * r->timer.srtt_ns + rtt) / 8 : rtt;
        r->timer.rto_ns = 3 * r->timer.srtt_ns + RTO_MIN_NS;
        if (r->timer.rto_ns > RTO_MAX_NS) r->timer.rto_ns = RTO_MAX_NS;
        r->timer.tries = 0;
    }
    int probed = final && r->state == S_PROBE;
    close_if_ok(eng, s, r, now);
    if (r->member.follows) group_on_ack(eng, s, r, &a, final, now);
    else if (probed && r->state == S_PROBE) txr_next_pass(eng, s, r, now);
}

void txr_on_done(p2p_engine *eng, struct p2p_send *s, struct txr *r, const uint8_t *body, size_t blen,
                    uint64_t now) {
    struct done_body d;
    if (blen != DONE_BODY) { CNT(eng, drop_bad_length, 1); return; }
    wire_get_done(body, &d);
    r->timer.last_heard_ns = now;
    if (r->state == S_DONE) return;
    if (d.flags & DONE_COMPLETE)
        for (uint32_t k = 0; k < s->nchunks; k++) mark_acked(s, r, k);
    if (d.total > r->report.peer_total) r->report.peer_total = d.total;
    if (r->member.follows && d.total) r->report.reached = 1; /* all it got came through the group */
    note_arrivals(r, d.total, now);
    r->report.peer_chunks = d.chunks;
    int result = r->state == S_CLOSE ? r->result : P2P_SEND_EARLY_CLOSED;
    if (r->acked.count == s->nchunks) result = P2P_SEND_EXACT;
    txr_finish(eng, s, r, result, now);
}

/* Timers of one receiver's send: deadline, slow-close limit, lost probes or CLOSEs, a stalled window. */
void txr_timers(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_DONE) return;
    if (r->state != S_CLOSE && s->deadline_ns && now >= s->deadline_ns) {
        start_close(eng, s, r, P2P_SEND_DEADLINE, now);
        return;
    }
    if (r->state != S_CLOSE && r->timer.slow_ns && now >= r->timer.slow_ns && holds_message(r)) {
        start_close(eng, s, r, P2P_SEND_SLOW, now);
        return;
    }
    if (now - r->timer.last_heard_ns > UNREACHABLE_NS && r->timer.tries >= 3) {
        txr_finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return;
    }
    if (r->member.follows && (r->state == S_SEND || r->state == S_PROBE)) return; /* the group's timer watches it */
    uint64_t since = r->state == S_SEND ? now - r->timer.last_ack_ns : now - r->timer.probe_ns;
    if (since < r->timer.rto_ns) return;
    if (r->state == S_SEND && txr_window_open(eng, s, r)) return;
    r->timer.tries++;
    r->timer.rto_ns = r->timer.rto_ns * 2 > RTO_MAX_NS ? RTO_MAX_NS : r->timer.rto_ns * 2;
    if (r->state == S_CLOSE) {
        if (r->timer.tries > CLOSE_TRIES) txr_finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        else send_close(eng, s, r, now);
        return;
    }
    if (r->state == S_JOIN) {
        if (r->timer.tries <= JOIN_TRIES) {
            txr_send_join(eng, s, r, now);
            return;
        }
        r->member.follows = 0; /* by unicast from the start */
        r->state = S_SEND;
        group_check(eng, s, now);
        return;
    }
    txr_send_probe(eng, s, r, now); /* lost probe answer, or a stalled window: ask where the receiver is */
    r->timer.last_ack_ns = now;
}

uint64_t txr_next_wake(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    uint64_t wake = UINT64_MAX;
    if (r->state == S_DONE) return wake;
    if (s->deadline_ns && r->state != S_CLOSE) wake = s->deadline_ns;
    if (r->timer.slow_ns && r->state != S_CLOSE && holds_message(r) && r->timer.slow_ns < wake) wake = r->timer.slow_ns;
    if (r->member.follows && (r->state == S_SEND || r->state == S_PROBE))
        return wake; /* the group's timer watches it */
    int sending = r->state == S_SEND && r->pass.pos < r->pass.len && txr_window_open(eng, s, r);
    if (!sending) { /* waiting for the receiver: its answer, or the retransmission timer (see tx_timers) */
        uint64_t t = (r->state == S_SEND ? r->timer.last_ack_ns : r->timer.probe_ns) + r->timer.rto_ns;
        if (t < wake) wake = t;
    } else {
        /* Wake once half a bucket is there: one batch per wake-up, not one datagram; or once the
         * pass's tail is (at most the next datagram and full ones after it). */
        double dgram = (double)(WIRE_HDR + s->chunk + WIRE_OVERHEAD);
        uint32_t k = r->pass.list ? r->pass.list[r->pass.pos] : r->pass.pos;
        double left = (double)(WIRE_HDR + chunk_len(s, k) + WIRE_OVERHEAD)
                      + (double)(r->pass.len - r->pass.pos - 1) * dgram;
        uint64_t w = pacer_wait(&r->pace, dgram, left), u = pacer_wait(&eng->uplink, dgram, left);
        uint64_t t = now + (w > u ? w : u);
        if (t < wake) wake = t;
    }
    return wake;
}

void txr_pass_sent(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->pass.index == 0) r->pass.first_done = 1;
    r->state = S_PROBE;
    r->timer.tries = 0;
    txr_send_probe(eng, s, r, now); /* queued behind the pass's data */
}
