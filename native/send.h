/* One message's send (struct p2p_send, built by send.c from the caller's segments) and its send to
 * each receiver, or to its multicast group (struct txr), whose state machine txr.c and group.c run.
 *
 * Ownership and threads: p2p_send_start (the caller's thread) allocates everything here and fills
 * it before the I/O thread sees the send; from then on the I/O thread alone writes a txr, until the
 * send is done (s->done under eng->mu), after which the caller reads the stats (send.c). The last
 * of the two references (caller's, I/O thread's) frees it all (send_unref). */
#ifndef P2P_SEND_H
#define P2P_SEND_H
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "pacer.h"

enum tx_state { S_SEND, S_PROBE, S_CLOSE, S_DONE, S_JOIN };

/* What the receiver acknowledged (ACK bitmaps, DONE). Arrays allocated at start for the message's
 * chunks and segments (none in a group's txr), freed by send_unref. */
struct txr_acks {
    uint8_t *chunks;              /* bitmap: chunk k acknowledged */
    uint32_t count, meta;         /* chunks acknowledged; of them, meta chunks */
    uint64_t *seg_bytes;          /* acknowledged bytes per segment */
    uint8_t *seg_ok;              /* segment within its loss bound */
    uint32_t nseg_ok;
    uint64_t need_left;           /* bytes the segments' bounds still need acknowledged */
};

/* The transmission pass in flight. */
struct txr_pass {
    uint16_t index;               /* 0 sends all, later ones what is missing */
    uint32_t *list;               /* chunks of this pass, ascending; NULL in pass 0 (every chunk in
                                   * order). Owned: next_pass replaces it, send_unref frees the last */
    uint32_t len, pos;            /* its length, and the next entry to send */
    uint32_t peer_high, peer_count; /* the receiver's view of this pass, from ACKs */
    int first_done;               /* the first pass went out whole */
};

/* Retransmission, probe and close timing. */
struct txr_timer {
    uint64_t last_ack_ns;         /* latest progress in this pass (the stall timer's start) */
    uint64_t last_heard_ns;       /* latest reply of any kind (unreachable after long silence) */
    uint64_t probe_ns;            /* latest probe, JOIN or CLOSE sent */
    uint64_t srtt_ns, rto_ns;
    uint32_t tries;               /* unanswered probes, JOINs or CLOSEs */
    uint64_t slow_ns;             /* slow close: start + slow_factor x planned time (send.c); 0 = none */
};

/* First pass, from the receiver's replies: when the first and the latest reported the count of
 * datagrams received (the ACK-based delivery rate, see p2p_receiver_stats.ack_rate). */
struct txr_arrivals {
    uint64_t first_ns, last_ns;
    uint32_t first_total, last_total;
};

/* What p2p_send_receiver_stats reports (with result, acked and arrivals). */
struct txr_report {
    uint64_t sent, retrans;       /* datagrams sent to it (through the group too), of them resent */
    uint64_t peer_total;          /* datagrams it reported received, all passes */
    uint32_t peer_chunks;         /* chunks it reported at DONE */
    uint32_t passes;
    uint64_t close_ns, done_ns;   /* when its close started, when it ended */
    int error;                    /* errno of a send the kernel refused (result UNREACHABLE), else 0 */
    uint8_t reached;              /* member: datagrams sent to the group arrived (stats `multicast`) */
};

/* A receiver asked for multicast. */
struct txr_member {
    uint8_t follows;              /* its passes are the group's (set until it leaves for unicast or ends) */
    uint8_t answered;             /* answered the probe that ended the group's pass */
};

/* The send of one message to one receiver; also the send to a group (struct p2p_send's `group`),
 * whose addr, pace, pass and timer serve every member that follows it. */
struct txr {
    struct sockaddr_in addr;      /* set at start, read-only after */
    struct pacer pace;
    int state, result;            /* enum tx_state; P2P_SEND_* once closing or done */
    struct txr_acks acked;
    struct txr_pass pass;
    struct txr_timer timer;
    struct txr_arrivals arrivals;
    struct txr_report report;
    struct txr_member member;
};

struct p2p_send {
    struct p2p_send *next;        /* command queue (under eng->mu), then the I/O thread's active list */
    p2p_engine *eng;              /* held: the send holds a reference on its engine */
    int refs, done;               /* under eng->mu */
    /* The message, laid out [meta][segments] (flat offsets), read-only after start: */
    uint32_t msg, nseg;
    const uint8_t **seg_ptr;      /* owned array; the segments' memory is the caller's, read in place */
    uint64_t *seg_flat, *seg_len, *seg_need; /* owned; need: bytes that must arrive */
    uint8_t *meta;                /* owned: the encoded meta (wire.h) */
    uint32_t meta_len, meta_chunks;
    uint64_t total;               /* flat bytes: meta + segments + alignment */
    uint32_t chunk, nchunks;
    uint32_t *chunk_seg;          /* owned: first segment that chunk k overlaps */
    uint64_t start_ns, deadline_ns;
    /* Its receivers: */
    uint32_t nrcv, nactive;       /* nactive: not yet done (I/O thread) */
    struct txr *r;                /* owned, nrcv */
    struct txr *group;            /* owned: the send to this sender's group; NULL without multicast receivers */
};

/* The header of a datagram about s (sender, pass and chunk left 0). */
static inline void send_hdr(const struct p2p_send *s, uint8_t type, struct wire_hdr *h) {
    memset(h, 0, sizeof *h);
    h->type = type;
    h->msg = s->msg;
    h->nchunks = s->nchunks;
    h->chunk_size = s->chunk;
    h->meta_len = s->meta_len;
}

/* Bytes of chunk k (the last one may be short). */
static inline uint32_t chunk_len(const struct p2p_send *s, uint32_t k) {
    uint64_t a = (uint64_t)k * s->chunk;
    uint64_t left = s->total - a;
    return left < s->chunk ? (uint32_t)left : s->chunk;
}

/* Drops one reference; the last frees the send. */
void send_unref(struct p2p_send *s);

#endif
