/* Engine internals shared by the engine's source files (not part of the public API). */
#ifndef P2P_ENGINE_H
#define P2P_ENGINE_H
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include "auth.h"
#include "error.h"
#include "p2pcast.h"
#include "mcast.h"
#include "replay.h"
#include "wire.h"

#define BIT_GET(bm, i) (((bm)[(i) >> 3] >> ((i) & 7)) & 1u)
#define BIT_SET(bm, i) ((bm)[(i) >> 3] |= (uint8_t)(1u << ((i) & 7)))
#define WIRE_OVERHEAD 42          /* IPv4 + UDP + Ethernet bytes on the link, for pacing and rates */
/* Datagrams between the first and the last reply that an ACK-based rate needs: the receiver ACKs
 * every 32, so two ACK intervals at least. */
#define ACK_RATE_MIN_DGRAMS 64
#define CNT(eng, field, n) __atomic_fetch_add(&(eng)->counters.field, (uint64_t)(n), __ATOMIC_RELAXED)

enum tx_state { S_SEND, S_PROBE, S_CLOSE, S_DONE, S_JOIN };

/* The send of one message to one receiver; also the send to a group (struct p2p_send's `group`),
 * whose addr, pacing, pass, plist, peer_high and timers serve every member that follows it. */
struct txr {
    struct sockaddr_in addr;
    double rate, tokens;          /* pacing: token bucket in wire bytes */
    uint64_t refill_ns;
    int state, result;
    uint8_t *acked;               /* chunk bitmap from the receiver's ACKs */
    uint32_t nacked, meta_acked;
    uint64_t *seg_acked;          /* acknowledged bytes per segment */
    uint8_t *seg_ok;              /* segment within its loss bound */
    uint32_t nseg_ok;
    uint16_t pass;                /* transmission pass: 0 sends all, later ones what is missing */
    uint32_t *plist, plen, ppos;  /* chunks of this pass (NULL in pass 0: every chunk in order) */
    uint32_t peer_high, peer_count; /* receiver's view of this pass, from ACKs */
    int first_pass_done;
    uint64_t last_ack_ns, last_heard_ns, probe_ns, srtt_ns, rto_ns, done_ns;
    uint32_t tries, passes;
    uint64_t sent, retrans, peer_total;
    uint32_t peer_chunks;         /* chunks the receiver reported at DONE */
    /* First pass, from the receiver's replies: when the first and the latest reported the count
     * of datagrams received (the ACK-based delivery rate, see p2p_receiver_stats.ack_rate). */
    uint64_t ack_first_ns, ack_last_ns;
    uint32_t ack_first_total, ack_last_total;
    uint64_t need_left;           /* bytes the segments' bounds still need acknowledged */
    uint64_t slow_ns;             /* slow close: start + slow_factor x planned time; 0 = none */
    uint64_t close_ns;            /* when its close started */
    int error;                    /* errno of a send the kernel refused (result UNREACHABLE), else 0 */
    uint8_t follows;              /* member: its passes are the group's (set until it leaves for unicast or ends) */
    uint8_t answered;             /* member: answered the probe that ended the group's pass */
    uint8_t reached;              /* member: datagrams sent to the group arrived (stats `multicast`) */
};

struct p2p_send {
    struct p2p_send *next;        /* command queue, then the I/O thread's active list */
    p2p_engine *eng;
    int refs, done;               /* under eng->mu */
    uint32_t msg, nseg;
    const uint8_t **seg_ptr;
    uint64_t *seg_flat, *seg_len, *seg_need; /* need: bytes that must arrive */
    uint8_t *meta;
    uint32_t meta_len, meta_chunks;
    uint64_t total;               /* flat bytes: meta + segments + alignment */
    uint32_t chunk, nchunks;
    uint32_t *chunk_seg;          /* first segment that chunk k overlaps */
    uint64_t start_ns, deadline_ns;
    uint32_t nrcv, nactive;
    struct txr *r;
    struct txr *group;            /* owned: the send to this sender's group; NULL without multicast receivers */
};

/* A message being received. */
struct rx {
    struct rx *next;
    uint16_t sender, pass;
    uint32_t msg;
    struct sockaddr_in src;
    uint32_t nchunks, chunk, meta_len, meta_chunks, meta_received, received;
    uint64_t cap, total;          /* cap = nchunks * chunk; total known once the end arrived */
    uint8_t *base, *flat, *bitmap;
    uint32_t pass_high, pass_count, dgrams, unacked;
    uint64_t last_ack_ns, last_seen_ns;
    uint64_t bytes_in, bytes_out; /* datagram bytes received for it, control bytes sent about it */
    int group;                    /* slot of eng->mc it holds a membership reference on (announced by JOIN), or -1 */
};

struct tombstone {
    uint16_t sender;
    uint32_t msg;
    struct sockaddr_in src;
    uint32_t flags, total, chunks;
    uint64_t at_ns;
};
#define TOMBSTONES 4096

/* A source (address and port) with deliveries waiting on the queue, and what they hold of its
 * quotas (max_queued_*). Lives while it has one; owned by the engine, under its mu. */
struct queued_source {
    struct queued_source *next;
    struct sockaddr_in addr;
    uint32_t messages;
    uint64_t bytes;
};

struct delivery_priv {
    p2p_delivery pub;             /* first: the public view */
    struct delivery_priv *next;
    uint8_t *base, *bitmap;
    uint64_t *segs;
    /* While on the queue (under eng->mu): its source's record, and the bytes it claims (its whole chunks). */
    struct queued_source *from;
    uint64_t claim;
};

struct p2p_engine {
    int fd, evfd, epfd, want_out, gso, gro;
    int no_pwait2;                /* I/O thread: the kernel lacks epoll_pwait2 (before 5.11) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int closing, refs;            /* under mu */
    struct p2p_send *cmd_head, *cmd_tail;
    /* Under mu: the delivery queue, oldest first (the I/O thread adds, p2p_recv takes), and the
     * sources it holds deliveries of; counters.queued_* are its totals, written under mu only. */
    struct delivery_priv *dq_head, *dq_tail;
    struct queued_source *dq_sources;
    /* I/O thread only: */
    struct p2p_send *active;
    struct rx *rxs;               /* newest first */
    uint32_t rx_open;             /* messages in rxs, and the bytes they claim (quotas) */
    uint64_t rx_claimed;
    struct tombstone tomb[TOMBSTONES];
    uint32_t tomb_next;
    double up_tokens;
    uint64_t up_refill_ns, last_sweep_ns, rng;
    uint8_t *rbuf, *sbuf;
    struct batch *batch;          /* sendmmsg scratch */
    struct auth auth;             /* tags on what it sends and receives */
    struct auth_stream group_stream; /* IVs of what it sends to its multicast group (auth.h) */
    struct replay replay;         /* what it already received */
    struct mcast mc;              /* multicast socket and memberships (mc.fd -1: multicast off) */
    /* settings */
    p2p_config cfg;
    struct sockaddr_in local;
    p2p_counters counters;
};

uint64_t now_ns(void);
void segment_coverage(const uint8_t *bitmap, uint32_t nchunks, uint32_t chunk, uint64_t meta_len,
                      const uint64_t *seg_off, const uint64_t *seg_len, uint32_t nseg, uint64_t *out);
void engine_unref(p2p_engine *eng);
/* With mu held: takes d (the one after prev; prev NULL: the head) off the delivery queue and out of its quotas. */
void dq_remove(p2p_engine *eng, struct delivery_priv *d, struct delivery_priv *prev);
/* Frees deliveries linked through next. */
void deliveries_free(struct delivery_priv *list);

/* io.c: the I/O thread (tx.c and rx.c are its parts, see io.h) */
int io_init(p2p_engine *eng);
void *io_main(void *arg);
void io_finish_all(p2p_engine *eng);
/* send.c */
void send_unref(struct p2p_send *s);

#endif
