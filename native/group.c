/* The send to a multicast group (IP multicast; memberships and sockets are mcast.c's).
 * Members follow the group from their JOIN's answer on: the group sends each pass once (paced at
 * the slowest member's rate, its window held by the member furthest behind), then probes every
 * member; when all answered, the next pass goes to the group while on average each chunk resent
 * serves two members or more (shared loss: the sender's queue, its uplink), else each member
 * repairs by unicast (independent loss: a chunk resent to the group would mostly reach members
 * that have it). A member that hears nothing through the group, or stops answering, goes on by
 * unicast alone; so does one whose JOIN is refused or unanswered.
 * Tuning: ANSWER_TRIES and MEMBER_SILENT_NS, how long a silent member holds the group up. */
#include <stdlib.h>

#include "tx.h"

#define ANSWER_TRIES 3            /* unanswered group probes before a silent member stops holding up the group */
/* ... and silent this long (no ACK at all): a member on a busy host (its I/O thread waiting for a
 * core) falls silent for tens of ms and must not be sent a whole message again by unicast for it. */
#define MEMBER_SILENT_NS 500000000ull

/* A member closed as slow no longer sets the group's pace: the slowest paced member still following
 * does (the group was paced at the slowest of all: init_group, send.c). */
void group_repace(struct p2p_send *s) {
    double pace = 0;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        const struct txr *m = &s->r[i];
        if (m->member.follows && m->pace.rate > 0 && (pace == 0 || m->pace.rate < pace)) pace = m->pace.rate;
    }
    if (pace > 0) s->group->pace.rate = pace;
}

/* A member leaves the group for unicast, taking on from what it acknowledged. */
static void leave_for_unicast(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    r->member.follows = 0;
    r->pass.first_done = 1; /* its next pass sends whatever it lacks, sent by the group or not */
    txr_next_pass(eng, s, r, now);
}

/* Every member goes on by unicast; the group is done. */
void group_dissolve(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    s->group->state = S_DONE;
    for (uint32_t i = 0; i < s->nrcv; i++)
        if (s->r[i].member.follows) leave_for_unicast(eng, s, &s->r[i], now);
}

/* The group's pass went out: every member is asked for its bitmap. */
void group_pass_sent(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    g->state = S_PROBE;
    g->timer.rto_ns = RTO_MIN_NS;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->member.follows) continue;
        if (r->timer.rto_ns > g->timer.rto_ns) g->timer.rto_ns = r->timer.rto_ns; /* the slowest member's answer */
        r->pass.len = g->pass.len; /* the pass it took part in: next_pass measures its loss on it */
        r->report.sent += g->pass.len;
        if (g->pass.index) r->report.retrans += g->pass.len;
        else r->pass.first_done = 1;
        r->state = S_PROBE;
        r->member.answered = 0;
        r->timer.tries = 0;
        r->timer.probe_ns = now;
    }
    /* One probe through the group: behind the pass's data in each member's multicast socket (one
     * sent by unicast could overtake data still queued there and be answered too soon). */
    txr_send_probe(eng, s, g, now);
}

/* Every member answered: each one's next pass (what its bounds still need), and whether they go to
 * the group as one pass (their union) or to each member by unicast. */
static void group_next_pass(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    uint8_t *want = calloc(1, (s->nchunks + 7) / 8 + 1);
    if (!want) { group_dissolve(eng, s, now); return; }
    g->state = S_CLOSE; /* deciding: members that end meanwhile do not start this again */
    uint64_t members = 0, sum = 0, n = 0;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->member.follows) continue;
        txr_next_pass(eng, s, r, now);
        if (!r->member.follows) continue; /* it ended (out of memory) */
        if (r->state != S_SEND) { r->member.follows = 0; continue; } /* nothing to resend: it probes on its own */
        members++;
        sum += r->pass.len;
        for (uint32_t j = 0; j < r->pass.len; j++)
            if (!BIT_GET(want, r->pass.list[j])) { BIT_SET(want, r->pass.list[j]); n++; }
    }
    free(g->pass.list);
    g->pass.list = members >= 2 && sum >= 2 * n ? malloc(sizeof(uint32_t) * (n + 1)) : NULL;
    if (!g->pass.list) { /* each member sends the pass it has by unicast */
        free(want);
        g->state = S_DONE;
        for (uint32_t i = 0; i < s->nrcv; i++) s->r[i].member.follows = 0;
        return;
    }
    g->pass.len = 0;
    for (uint32_t k = 0; k < s->nchunks; k++)
        if (BIT_GET(want, k)) g->pass.list[g->pass.len++] = k;
    free(want);
    g->pass.pos = 0;
    g->pass.index++; /* as each member's next_pass did */
    g->report.passes++;
    g->pass.peer_high = 0;
    g->state = S_SEND;
    g->timer.last_ack_ns = now;
}

/* After a member's state changed: the group's window (the member furthest behind), its start once
 * every member answered its JOIN, its next pass once every member answered its probe, its end. */
void group_check(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    if (!g || g->state == S_DONE) return;
    uint32_t members = 0, joining = 0, waiting = 0, high = UINT32_MAX;
    uint64_t rto = RTO_MIN_NS;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        const struct txr *r = &s->r[i];
        if (!r->member.follows) continue;
        members++;
        joining += r->state == S_JOIN;
        waiting += r->state == S_PROBE && !r->member.answered;
        if (r->pass.peer_high < high) high = r->pass.peer_high;
        if (r->timer.rto_ns > rto) rto = r->timer.rto_ns;
    }
    if (!members) { g->state = S_DONE; return; }
    if (high > g->pass.peer_high) { /* progress: the stall timer starts over */
        g->pass.peer_high = high;
        g->timer.last_ack_ns = now;
        g->timer.rto_ns = rto;
    }
    if (g->state == S_JOIN && !joining) {
        g->state = S_SEND;
        g->pace.refill_ns = g->timer.last_ack_ns = now;
    } else if (g->state == S_PROBE && !waiting) {
        group_next_pass(eng, s, now);
    }
}

/* A member's ACK, after its bitmap was taken. A probe answer while a whole window is stalled that
 * shows nothing of it arrived means the group's data does not reach the member (its probes do).
 * Nothing of a pass that ended is no such sign: a member's first IGMP report goes out on a kernel
 * timer, after its answer to the JOIN, so a short first pass can pass by it before the switch
 * knows its port; that is repaired as any loss, through the group if others need it too. */
void group_on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct ack_body *a, int final,
                         uint64_t now) {
    struct txr *g = s->group;
    if (a->pass_count) r->report.reached = 1;
    if (final && !a->pass_count && g->state == S_SEND && !txr_window_open(eng, s, g))
        leave_for_unicast(eng, s, r, now);
    else if (final && r->state == S_PROBE)
        r->member.answered = 1;
    group_check(eng, s, now);
}

/* A stalled window, or members yet to answer the pass's probe: probe again, through the group so
 * that the probe stays behind the data (a member lagging behind a backlog answers late, not
 * wrongly). A member asked in vain ANSWER_TRIES times and silent meanwhile (a lagging one still
 * ACKs what it works through) goes on by unicast on its own; so does one the group never reaches
 * (that costs its first message MEMBER_SILENT_NS or so: "auto" mode probes for such peers first). */
void group_timers(p2p_engine *eng, struct p2p_send *s, uint64_t now) {
    struct txr *g = s->group;
    if (!g || (g->state != S_SEND && g->state != S_PROBE) || (g->state == S_SEND && txr_window_open(eng, s, g)))
        return;
    uint64_t since = g->state == S_SEND ? now - g->timer.last_ack_ns : now - g->timer.probe_ns;
    if (since < g->timer.rto_ns) return;
    for (uint32_t i = 0; i < s->nrcv; i++) {
        struct txr *r = &s->r[i];
        if (!r->member.follows || (g->state == S_PROBE && (r->state != S_PROBE || r->member.answered))) continue;
        uint64_t silent = now - r->timer.last_heard_ns;
        if (++r->timer.tries <= ANSWER_TRIES || silent <= g->timer.rto_ns || silent <= MEMBER_SILENT_NS) continue;
        if (r->state == S_SEND) leave_for_unicast(eng, s, r, now); /* a fresh pass of what it lacks */
        else r->member.follows = 0; /* it probes on its own for the answer it owes */
    }
    g->timer.rto_ns = g->timer.rto_ns * 2 > RTO_MAX_NS ? RTO_MAX_NS : g->timer.rto_ns * 2;
    g->timer.last_ack_ns = now;
    txr_send_probe(eng, s, g, now);
    group_check(eng, s, now); /* members that left may have been all it waited for */
}
