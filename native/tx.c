/* The sending side on the I/O thread: takes new sends from the command queue, pumps every pass that
 * pacing and windows allow (round-robin over receivers and groups), routes replies and timers to
 * each receiver's send (txr.c) and group (group.c), and retires sends once done.
 * Receivers asked for multicast are first told to join this sender's group (JOIN); while they follow
 * it, the group's passes (one datagram for all) stand for theirs. */
#include "batch.h"
#include "tx.h"

/* Wakes p2p_send_wait: every receiver's send of s ended. */
void send_complete(p2p_engine *eng, struct p2p_send *s) {
    pthread_mutex_lock(&eng->mu);
    s->done = 1;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
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

/* Sends up to `budget` datagrams of r's current pass (r may be the group): the chunks that pacing
 * (r's and the uplink's) and the window allow, in one batch. Returns how many went out, -1 when the
 * socket is full. */
static int pump_receiver(p2p_engine *eng, struct p2p_send *s, struct txr *r, int budget, uint64_t now) {
    double dgram = (double)(WIRE_HDR + s->chunk + WIRE_OVERHEAD);
    pacer_refill(&r->pace, dgram, now);
    pacer_refill(&eng->uplink, dgram, now);
    uint32_t ks[BATCH_MAX_DGRAMS], start_pos = r->pass.pos;
    int n = 0;
    double spent = 0;
    while (n < budget && n < BATCH_MAX_DGRAMS && r->pass.pos < r->pass.len && txr_window_open(eng, s, r)) {
        uint32_t k = r->pass.list ? r->pass.list[r->pass.pos] : r->pass.pos;
        double cost = (double)(WIRE_HDR + chunk_len(s, k) + WIRE_OVERHEAD);
        if (!pacer_allows(&r->pace, spent + cost) || !pacer_allows(&eng->uplink, spent + cost)) break;
        ks[n++] = k;
        spent += cost;
        r->pass.pos++; /* (the window moves with it) */
    }
    if (n == 0) return 0;
    struct batch_result out;
    batch_send(eng, s, &r->addr, r == s->group, r->pass.index, ks, n, &out);
    r->pass.pos = start_pos + (uint32_t)out.dgrams; /* what did not go out is sent next time */
    if (out.error) {
        /* The kernel refuses this destination (EACCES, ENETUNREACH, EPERM from a firewall, ...):
         * retrying cannot help, and waiting for the socket to be writable would spin and starve
         * every other receiver. This receiver ends; the others go on. */
        r->report.error = out.error;
        CNT(eng, send_errors, 1);
        if (r == s->group) group_dissolve(eng, s, now); /* no multicast route: every member by unicast */
        else txr_finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return 0;
    }
    double paid = (double)out.bytes + (double)out.dgrams * WIRE_OVERHEAD;
    pacer_pay(&r->pace, paid);
    pacer_pay(&eng->uplink, paid);
    r->report.sent += (uint64_t)out.dgrams;
    if (r->pass.index > 0) {
        r->report.retrans += (uint64_t)out.dgrams;
        CNT(eng, retransmissions, out.dgrams);
    }
    CNT(eng, datagrams_sent, out.dgrams);
    CNT(eng, bytes_sent, out.bytes);
    if (r == s->group) CNT(eng, mcast_datagrams_sent, out.dgrams);
    if (r->pass.pos == r->pass.len) {
        if (r == s->group) group_pass_sent(eng, s, now);
        else txr_pass_sent(eng, s, r, now);
    }
    return out.blocked ? -1 : out.dgrams;
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
            r->pace.refill_ns = r->timer.last_ack_ns = r->timer.last_heard_ns = now;
            if (find_txr(eng, s->msg, &r->addr, &other)) txr_finish(eng, s, r, P2P_SEND_DUPLICATE, now);
            else if (r->member.follows) txr_send_join(eng, s, r, now);
        }
        s->next = eng->active;
        eng->active = s;
        if (s->nrcv == 0) send_complete(eng, s);
        s = next;
    }
    eng->uplink.refill_ns = eng->uplink.refill_ns ? eng->uplink.refill_ns : now;
}

void tx_on_reply(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *body,
                 size_t blen, uint64_t now) {
    struct p2p_send *s;
    struct txr *r = find_txr(eng, h->msg, src, &s);
    if (!r) { CNT(eng, drop_unknown, 1); return; }
    if (h->type == T_ACK) txr_on_ack(eng, s, r, h, body, blen, now);
    else txr_on_done(eng, s, r, body, blen, now);
}

void tx_timers(p2p_engine *eng, uint64_t now) {
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        for (uint32_t i = 0; i < s->nrcv; i++) txr_timers(eng, s, &s->r[i], now);
        group_timers(eng, s, now);
    }
}

/* The earliest of `wake` and the time any send next has something to do. */
uint64_t tx_next_wake(p2p_engine *eng, uint64_t now, uint64_t wake) {
    for (struct p2p_send *s = eng->active; s; s = s->next)
        for (uint32_t i = 0; i <= s->nrcv; i++) { /* the receivers, then the group */
            struct txr *r = i < s->nrcv ? &s->r[i] : s->group;
            if (!r || (r == s->group && r->state != S_SEND && r->state != S_PROBE)) continue;
            uint64_t t = txr_next_wake(eng, s, r, now);
            if (t < wake) wake = t;
        }
    return wake;
}

/* After the I/O thread stopped: every send, queued or active, ends as cancelled. */
void tx_cancel_all(p2p_engine *eng, uint64_t now) {
    tx_take_commands(eng, now);
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        for (uint32_t i = 0; i < s->nrcv; i++) txr_finish(eng, s, &s->r[i], P2P_SEND_CANCELLED, now);
        if (s->nrcv == 0) send_complete(eng, s);
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
                if (!r || r->member.follows || r->state != S_SEND || r->pass.pos >= r->pass.len) continue;
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
