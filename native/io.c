/* The I/O thread: one epoll loop that paces and sends chunks, takes ACKs, retransmits what is
 * missing, closes early, and reassembles incoming messages. Python never runs here. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define WIRE_OVERHEAD 42          /* IPv4 + UDP + Ethernet bytes on the link, for pacing */
#define MAX_DGRAMS 256            /* datagrams per sendmmsg */
#define MAX_MSGS 64
#define MAX_GSO_SEGS 64
#define MAX_GSO_BYTES 65000
#define PIECES 6                  /* iovecs per datagram before gathering into a staging copy */
#define STAGE_SLOTS 64
#define RECV_SLOTS 32
#define ACK_EVERY 32              /* datagrams between receiver ACKs */
/* A timer ACK only reports a stream that paused (a pass ends with a probe, answered at once); a
 * shorter delay ACKs every datagram of a slow flow, and those ACKs crowd the receiver's own uplink. */
#define ACK_DELAY_NS 20000000ull
#define SWEEP_NS 20000000ull
#define RTO_MIN_NS 5000000ull
#define RTO_MAX_NS 1000000000ull
#define UNREACHABLE_NS 3000000000ull
#define CLOSE_TRIES 10
#define TOMB_NS 30000000000ull
#define ACK_BITS ((WIRE_ACK_MAX - WIRE_HDR - ACK_BODY) * 8u)

static const uint8_t zeros[8];

static int same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b) {
    return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port;
}

/* ---- control datagrams ---- */

static void send_ctl(p2p_engine *eng, const struct sockaddr_in *to, struct wire_hdr *h, const uint8_t *body,
                     size_t blen) {
    uint8_t buf[WIRE_ACK_MAX];
    h->sender = eng->cfg.sender_id;
    wire_put_hdr(buf, h);
    if (blen) memcpy(buf + WIRE_HDR, body, blen);
    struct iovec b = {buf + WIRE_HDR, blen};
    wire_sign(&eng->key, buf, &b, 1);
    /* Best effort: every control datagram is re-sent by the protocol if it is lost. */
    if (sendto(eng->fd, buf, WIRE_HDR + blen, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof *to) > 0) {
        CNT(eng, datagrams_sent, 1);
        CNT(eng, bytes_sent, WIRE_HDR + blen);
    }
}

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
    uint8_t body[4] = {0};
    tx_hdr(s, T_PROBE, &h);
    put16(body, r->pass);
    send_ctl(eng, &r->addr, &h, body, sizeof body);
    r->probe_ns = now;
}

static void send_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    struct wire_hdr h;
    tx_hdr(s, T_CLOSE, &h);
    send_ctl(eng, &r->addr, &h, NULL, 0);
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
    if (--s->nactive == 0) complete_send(eng, s);
}

static int close_ok(const struct p2p_send *s, const struct txr *r) {
    return r->first_pass_done && r->meta_acked == s->meta_chunks && r->nseg_ok == s->nseg;
}

static void start_close(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now) {
    r->state = S_CLOSE;
    r->result = result;
    r->tries = 0;
    r->rto_ns = r->srtt_ns ? 3 * r->srtt_ns + RTO_MIN_NS : 50000000ull;
    send_close(eng, s, r, now);
}

static void close_if_ok(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_SEND || r->state == S_PROBE) {
        if (close_ok(s, r))
            start_close(eng, s, r, r->nacked == s->nchunks ? P2P_SEND_EXACT : P2P_SEND_EARLY_CLOSED, now);
        else if (s->deadline_ns && now >= s->deadline_ns)
            start_close(eng, s, r, P2P_SEND_DEADLINE, now);
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

struct batch {
    struct mmsghdr mm[MAX_MSGS];
    struct iovec iov[MAX_DGRAMS * (PIECES + 1)];
    uint8_t hdr[MAX_DGRAMS][WIRE_HDR];
    char cmsg[MAX_MSGS][CMSG_SPACE(sizeof(uint16_t))];
    int msg_dgrams[MAX_MSGS];
    uint16_t msg_size[MAX_MSGS];  /* GSO segment size: every datagram of the message has it */
};

int io_init(p2p_engine *eng) {
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
        wire_sign(&eng->key, B->hdr[nd], iv + 1, np);
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
    if (r->ppos == r->plen) {
        /* Pass done: ask for the receiver's bitmap; the probe queues behind the data. */
        if (r->pass == 0) r->first_pass_done = 1;
        r->state = S_PROBE;
        r->tries = 0;
        send_probe(eng, s, r, now);
    }
    if (sent < nm) return -1;
    return dgrams;
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
    if ((a.flags & ACK_FINAL) && a.pass == r->pass) {
        uint64_t rtt = now - r->probe_ns;
        r->srtt_ns = r->srtt_ns ? (7 * r->srtt_ns + rtt) / 8 : rtt;
        r->rto_ns = 3 * r->srtt_ns + RTO_MIN_NS;
        if (r->rto_ns > RTO_MAX_NS) r->rto_ns = RTO_MAX_NS;
        r->tries = 0;
        if (r->state == S_PROBE) {
            close_if_ok(eng, s, r, now);
            if (r->state == S_PROBE) next_pass(eng, s, r, now);
            return;
        }
    }
    close_if_ok(eng, s, r, now);
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

/* Timers of one receiver's send: deadline, lost probes or CLOSEs, a stalled window. */
static void tx_timers(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    if (r->state == S_DONE) return;
    if (r->state != S_CLOSE && s->deadline_ns && now >= s->deadline_ns) {
        start_close(eng, s, r, P2P_SEND_DEADLINE, now);
        return;
    }
    if (now - r->last_heard_ns > UNREACHABLE_NS && r->tries >= 3) {
        finish(eng, s, r, P2P_SEND_UNREACHABLE, now);
        return;
    }
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
    send_probe(eng, s, r, now); /* lost probe answer, or a stalled window: ask where the receiver is */
    r->last_ack_ns = now;
}

static uint64_t tx_next_wake(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now) {
    uint64_t wake = UINT64_MAX;
    if (r->state == S_DONE) return wake;
    if (s->deadline_ns && r->state != S_CLOSE) wake = s->deadline_ns;
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

/* ---- receiver ---- */

static void rx_send_ack(p2p_engine *eng, struct rx *m, uint32_t start, uint32_t nbits, uint16_t flags, uint64_t now) {
    uint8_t body[WIRE_ACK_MAX - WIRE_HDR];
    struct ack_body a = {m->pass, flags, m->pass_high, m->pass_count, m->dgrams, start, nbits};
    wire_put_ack(body, &a);
    memcpy(body + ACK_BODY, m->bitmap + start / 8, (nbits + 7) / 8);
    if (nbits % 8) body[ACK_BODY + nbits / 8] &= (uint8_t)((1u << (nbits % 8)) - 1);
    struct wire_hdr h = {.type = T_ACK, .msg = m->msg, .nchunks = m->nchunks, .chunk_size = m->chunk,
                         .meta_len = m->meta_len};
    send_ctl(eng, &m->src, &h, body, ACK_BODY + (nbits + 7) / 8);
    m->unacked = 0;
    m->last_ack_ns = now;
}

/* A periodic ACK: the stretch of the bitmap that this pass's latest chunks fall in. */
static void rx_ack_recent(p2p_engine *eng, struct rx *m, uint64_t now) {
    uint32_t hi = m->pass_high ? m->pass_high : m->nchunks;
    uint32_t start = hi > ACK_BITS ? (hi - ACK_BITS + 7) & ~7u : 0;
    rx_send_ack(eng, m, start, hi - start, 0, now);
}

/* A probe answer: the whole bitmap, the last slice flagged FINAL. */
static void rx_ack_all(p2p_engine *eng, struct rx *m, uint64_t now) {
    for (uint32_t start = 0;; start += ACK_BITS) {
        uint32_t n = m->nchunks - start > ACK_BITS ? ACK_BITS : m->nchunks - start;
        int last = start + n >= m->nchunks;
        rx_send_ack(eng, m, start, n, last ? ACK_FINAL : 0, now);
        if (last) break;
    }
}

static void send_done(p2p_engine *eng, uint32_t msg, const struct sockaddr_in *to, uint32_t flags, uint32_t total,
                      uint32_t chunks) {
    uint8_t body[DONE_BODY];
    struct done_body d = {flags, total, chunks};
    wire_put_done(body, &d);
    struct wire_hdr h = {.type = T_DONE, .msg = msg};
    send_ctl(eng, to, &h, body, sizeof body);
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
    free(m->base);
    free(m->bitmap);
    free(m);
}

/* Checks the segment table. Returns the number of segments, or -1 when it is invalid. */
static int64_t parse_meta(const struct rx *m, uint64_t *data_len) {
    const uint8_t *p = m->flat;
    uint32_t nseg = get32(p + 4), app_len = get32(p + 16);
    *data_len = get64(p + 8);
    if (get32(p) != m->meta_len || (uint64_t)nseg * META_ENTRY + META_FIXED + app_len > m->meta_len) return -1;
    uint64_t total = m->meta_len + *data_len;
    if (*data_len > m->cap || total > m->cap || total <= m->cap - m->chunk) return -1;
    if (m->total && m->total != total) return -1;
    uint64_t prev = 0;
    for (uint32_t i = 0; i < nseg; i++) {
        const uint8_t *e = p + META_FIXED + META_ENTRY * i;
        uint64_t off = get64(e), len = get64(e + 8), need = get64(e + 16);
        if (off < prev || off > *data_len || len > *data_len - off || need > len) return -1;
        prev = off + len;
    }
    return nseg;
}

/* With the meta in: has every segment at least the bytes its sender requires? */
static int bounds_met(const struct rx *m) {
    uint64_t data_len;
    int64_t nseg = parse_meta(m, &data_len);
    if (nseg <= 0) return nseg == 0;
    uint64_t *seg = malloc(sizeof(uint64_t) * 4 * (size_t)nseg);
    if (!seg) return 0;
    for (int64_t i = 0; i < nseg; i++) {
        const uint8_t *e = m->flat + META_FIXED + META_ENTRY * i;
        seg[i] = get64(e);
        seg[nseg + i] = get64(e + 8);
        seg[2 * nseg + i] = get64(e + 16);
    }
    segment_coverage(m->bitmap, m->nchunks, m->chunk, m->meta_len, seg, seg + nseg, (uint32_t)nseg, seg + 3 * nseg);
    int ok = 1;
    for (int64_t i = 0; i < nseg && ok; i++) ok = seg[3 * nseg + i] >= seg[2 * nseg + i];
    free(seg);
    return ok;
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
    uint64_t data_len = 0;
    int64_t nseg = m->meta_received == m->meta_chunks && m->flat ? parse_meta(m, &data_len) : -1;
    if (nseg >= 0) {
        d->segs = malloc(sizeof(uint64_t) * 2 * (size_t)(nseg + 1));
        if (d->segs) {
            for (int64_t i = 0; i < nseg; i++) {
                d->segs[i] = get64(m->flat + META_FIXED + META_ENTRY * i);
                d->segs[nseg + i] = get64(m->flat + META_FIXED + META_ENTRY * i + 8);
            }
            p->layout_known = 1;
            p->nseg = (uint32_t)nseg;
            p->seg_off = d->segs;
            p->seg_len = d->segs + nseg;
            p->app_len = get32(m->flat + 16);
            p->app = m->flat + META_FIXED + META_ENTRY * nseg;
            p->data_len = data_len;
        }
    }
    p->data = m->flat ? m->flat + m->meta_len : NULL;
    d->base = m->base;
    d->bitmap = m->bitmap;
    p->chunk_mask = m->bitmap;
    add_tomb(eng, m, reason == P2P_DELIVERED_COMPLETE ? DONE_COMPLETE : 0, now);
    m->base = m->bitmap = NULL; /* now owned by the delivery */
    rx_unlink_free(eng, m);
    if (reason == P2P_DELIVERED_EXPIRED) CNT(eng, messages_expired, 1);
    else CNT(eng, messages_delivered, 1);
    pthread_mutex_lock(&eng->mu);
    if (eng->dq_tail) eng->dq_tail->next = d; else eng->dq_head = d;
    eng->dq_tail = d;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}

/* Geometry from a DATA/PROBE/CLOSE header, checked before anything is allocated. */
static int geometry_ok(p2p_engine *eng, const struct wire_hdr *h) {
    if (h->chunk_size < 8 || h->nchunks == 0 || h->meta_len < 24) { CNT(eng, drop_bad_index, 1); return 0; }
    uint64_t cap = (uint64_t)h->nchunks * h->chunk_size;
    if (h->meta_len > cap) { CNT(eng, drop_bad_index, 1); return 0; }
    if (cap > eng->cfg.max_message_bytes + h->chunk_size) { CNT(eng, drop_too_large, 1); return 0; }
    return 1;
}

static struct rx *rx_create(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, int with_data,
                            uint64_t now) {
    struct rx *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->sender = h->sender;
    m->msg = h->msg;
    m->src = *src;
    m->nchunks = h->nchunks;
    m->chunk = h->chunk_size;
    m->meta_len = h->meta_len;
    m->meta_chunks = (h->meta_len + h->chunk_size - 1) / h->chunk_size;
    m->cap = (uint64_t)h->nchunks * h->chunk_size;
    m->bitmap = calloc(1, (h->nchunks + 7) / 8 + 1);
    if (with_data) {
        /* The data region starts 64-byte aligned so that arrays over it are aligned too. */
        size_t pad = (64 - h->meta_len % 64) % 64;
        m->base = calloc(1, pad + m->cap + 64);
        m->flat = m->base ? m->base + pad : NULL;
    }
    if (!m->bitmap || (with_data && !m->base)) {
        free(m->bitmap);
        free(m->base);
        free(m);
        return NULL;
    }
    m->last_seen_ns = m->last_ack_ns = now;
    m->next = eng->rxs;
    eng->rxs = m;
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

static void on_data(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *payload,
                    size_t len, uint64_t now) {
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
        if (!(m = rx_create(eng, h, src, 1, now))) { CNT(eng, drop_too_large, 1); return; }
    } else if (!same_geometry(m, h)) {
        CNT(eng, drop_bad_index, 1);
        return;
    }
    m->last_seen_ns = now;
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
        BIT_SET(m->bitmap, h->chunk);
        m->received++;
        if (h->chunk < m->meta_chunks) m->meta_received++;
        if (m->meta_received == m->meta_chunks && h->chunk < m->meta_chunks) {
            uint64_t dl;
            if (parse_meta(m, &dl) < 0) {
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
    if (++m->unacked >= ACK_EVERY) rx_ack_recent(eng, m, now);
}

static void on_probe_or_close(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src,
                              const uint8_t *body, size_t blen, uint64_t now) {
    if ((h->type == T_PROBE && blen != 4) || (h->type == T_CLOSE && blen != 0)) {
        CNT(eng, drop_bad_length, 1);
        return;
    }
    if (!geometry_ok(eng, h)) return;
    struct rx *m = find_rx(eng, h->sender, h->msg, src);
    if (m && !same_geometry(m, h)) { CNT(eng, drop_bad_index, 1); return; }
    if (!m) {
        struct tombstone *t = find_tomb(eng, h->sender, h->msg, src, now);
        if (t) {
            send_done(eng, h->msg, src, t->flags, t->total, t->chunks);
            return;
        }
        if (h->type == T_PROBE) {
            /* Nothing arrived yet: an empty final answer makes the sender send everything again. */
            uint8_t ab[ACK_BODY];
            struct ack_body a = {get16(body), ACK_FINAL, 0, 0, 0, 0, 0};
            wire_put_ack(ab, &a);
            struct wire_hdr r = {.type = T_ACK, .msg = h->msg, .nchunks = h->nchunks, .chunk_size = h->chunk_size,
                                 .meta_len = h->meta_len};
            send_ctl(eng, src, &r, ab, sizeof ab);
            return;
        }
        /* Closed before any chunk arrived: still deliver, so the receiver learns it got nothing. */
        if (!(m = rx_create(eng, h, src, 0, now))) return;
    }
    m->last_seen_ns = now;
    if (h->type == T_PROBE) {
        uint16_t pass = get16(body);
        if (pass > m->pass) {
            m->pass = pass;
            m->pass_high = m->pass_count = 0;
        }
        if (m->flat && m->meta_received == m->meta_chunks && bounds_met(m)) {
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

static void on_datagram(p2p_engine *eng, const struct sockaddr_in *src, const uint8_t *buf, size_t len, uint64_t now) {
    struct wire_hdr h;
    CNT(eng, datagrams_received, 1);
    CNT(eng, bytes_received, len);
    switch (wire_get_hdr(buf, len, &h)) {
    case 0: break;
    case -1: CNT(eng, drop_bad_length, 1); return;
    case -2: CNT(eng, drop_bad_magic, 1); return;
    case -3: CNT(eng, drop_bad_version, 1); return;
    default: CNT(eng, drop_bad_type, 1); return;
    }
    if (!wire_verify(&eng->key, buf, len)) { CNT(eng, drop_bad_tag, 1); return; }
    const uint8_t *body = buf + WIRE_HDR;
    size_t blen = len - WIRE_HDR;
    if (h.type == T_DATA) { on_data(eng, &h, src, body, blen, now); return; }
    if (h.type == T_PROBE || h.type == T_CLOSE) { on_probe_or_close(eng, &h, src, body, blen, now); return; }
    struct p2p_send *s;
    struct txr *r = find_txr(eng, h.msg, src, &s);
    if (!r) { CNT(eng, drop_unknown, 1); return; }
    if (h.type == T_ACK) on_ack(eng, s, r, &h, body, blen, now);
    else on_done(eng, s, r, body, blen, now);
}

/* Reads what the socket holds, in batches, splitting GRO-coalesced buffers into datagrams. */
static void drain(p2p_engine *eng) {
    struct mmsghdr mm[RECV_SLOTS];
    struct iovec iov[RECV_SLOTS];
    struct sockaddr_in from[RECV_SLOTS];
    char ctl[RECV_SLOTS][CMSG_SPACE(sizeof(int))];
    for (int round = 0; round < 16; round++) {
        for (int i = 0; i < RECV_SLOTS; i++) {
            iov[i].iov_base = eng->rbuf + (size_t)i * 65536;
            iov[i].iov_len = 65536;
            memset(&mm[i].msg_hdr, 0, sizeof mm[i].msg_hdr);
            mm[i].msg_hdr.msg_name = &from[i];
            mm[i].msg_hdr.msg_namelen = sizeof from[i];
            mm[i].msg_hdr.msg_iov = &iov[i];
            mm[i].msg_hdr.msg_iovlen = 1;
            mm[i].msg_hdr.msg_control = ctl[i];
            mm[i].msg_hdr.msg_controllen = sizeof ctl[i];
        }
        int n = recvmmsg(eng->fd, mm, RECV_SLOTS, MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            size_t len = mm[i].msg_len, seg = len;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&mm[i].msg_hdr); c; c = CMSG_NXTHDR(&mm[i].msg_hdr, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int g;
                    memcpy(&g, CMSG_DATA(c), sizeof g);
                    if (g > 0) seg = (size_t)g;
                }
            const uint8_t *p = iov[i].iov_base;
            size_t off = 0;
            do { /* an empty datagram is still one to count and drop */
                on_datagram(eng, &from[i], p + off, len - off < seg ? len - off : seg, now);
                off += seg;
            } while (off < len);
        }
        if (n < RECV_SLOTS) return;
    }
}

static void rx_timers(p2p_engine *eng, uint64_t now) {
    for (struct rx *m = eng->rxs, *next; m; m = next) {
        next = m->next;
        if (now - m->last_seen_ns > (uint64_t)eng->cfg.rx_idle_ms * 1000000ull) {
            deliver(eng, m, P2P_DELIVERED_EXPIRED, now); /* the sender went silent: free, never leak */
            continue;
        }
        if (m->unacked && now - m->last_ack_ns >= ACK_DELAY_NS) rx_ack_recent(eng, m, now);
    }
}

static void take_commands(p2p_engine *eng, uint64_t now) {
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
        }
        s->next = eng->active;
        eng->active = s;
        if (s->nrcv == 0) complete_send(eng, s);
        s = next;
    }
    eng->up_refill_ns = eng->up_refill_ns ? eng->up_refill_ns : now;
}

/* Removes finished sends from the active list, dropping the I/O thread's reference. */
static void reap_sends(p2p_engine *eng) {
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

/* Sends what pacing and windows allow, round-robin over receivers. Returns 1 if more is ready now. */
static int pump(p2p_engine *eng, uint64_t now) {
    int budget = 1024, progress = 1;
    while (budget > 0 && progress) {
        progress = 0;
        for (struct p2p_send *s = eng->active; s && budget > 0; s = s->next)
            for (uint32_t i = 0; i < s->nrcv && budget > 0; i++) {
                struct txr *r = &s->r[i];
                if (r->state != S_SEND || r->ppos >= r->plen) continue;
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

static void set_want_out(p2p_engine *eng, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = eng->fd};
    epoll_ctl(eng->epfd, EPOLL_CTL_MOD, eng->fd, &ev);
}

void *io_main(void *arg) {
    p2p_engine *eng = arg;
    int out_armed = 0;
    for (;;) {
        pthread_mutex_lock(&eng->mu);
        int closing = eng->closing;
        pthread_mutex_unlock(&eng->mu);
        if (closing) break;
        uint64_t now = now_ns();
        take_commands(eng, now);
        drain(eng);
        now = now_ns();
        for (struct p2p_send *s = eng->active; s; s = s->next)
            for (uint32_t i = 0; i < s->nrcv; i++) tx_timers(eng, s, &s->r[i], now);
        if (now - eng->last_sweep_ns > ACK_DELAY_NS) {
            rx_timers(eng, now);
            eng->last_sweep_ns = now;
        }
        int more = eng->want_out ? 0 : pump(eng, now);
        reap_sends(eng);

        uint64_t wake = now + SWEEP_NS;
        for (struct p2p_send *s = eng->active; s; s = s->next)
            for (uint32_t i = 0; i < s->nrcv; i++) {
                uint64_t t = tx_next_wake(eng, s, &s->r[i], now);
                if (t < wake) wake = t;
            }
        for (struct rx *m = eng->rxs; m; m = m->next)
            if (m->unacked && m->last_ack_ns + ACK_DELAY_NS < wake) wake = m->last_ack_ns + ACK_DELAY_NS;
        if (eng->want_out != out_armed) {
            set_want_out(eng, eng->want_out);
            out_armed = eng->want_out;
        }
        uint64_t wait = more || wake <= now ? 0 : wake - now;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        struct epoll_event evs[4];
        int n = epoll_pwait2(eng->epfd, evs, 4, &ts, NULL);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == eng->evfd) {
                uint64_t v;
                ssize_t rd = read(eng->evfd, &v, sizeof v);
                (void)rd;
            } else if (evs[i].events & EPOLLOUT) {
                eng->want_out = 0;
            }
        }
    }
    return NULL;
}

/* After the I/O thread stopped: end every send, free every partial message and undelivered delivery. */
void io_finish_all(p2p_engine *eng) {
    uint64_t now = now_ns();
    pthread_mutex_lock(&eng->mu);
    struct p2p_send *pending = eng->cmd_head;
    eng->cmd_head = eng->cmd_tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    while (pending) {
        struct p2p_send *next = pending->next;
        pending->next = eng->active;
        eng->active = pending;
        pending = next;
    }
    for (struct p2p_send *s = eng->active; s; s = s->next) {
        for (uint32_t i = 0; i < s->nrcv; i++) finish(eng, s, &s->r[i], P2P_SEND_CANCELLED, now);
        if (s->nrcv == 0) complete_send(eng, s);
    }
    reap_sends(eng);
    while (eng->rxs) rx_unlink_free(eng, eng->rxs);
    pthread_mutex_lock(&eng->mu);
    struct delivery_priv *d = eng->dq_head;
    eng->dq_head = eng->dq_tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    while (d) {
        struct delivery_priv *next = d->next;
        p2p_delivery_free(&d->pub);
        d = next;
    }
}
