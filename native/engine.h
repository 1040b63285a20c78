/* Engine internals shared by the engine's source files (not part of the public API). */
#ifndef P2P_ENGINE_H
#define P2P_ENGINE_H
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include "auth.h"
#include "bufpool.h"
#include "error.h"
#include "p2pcast.h"
#include "mcast.h"
#include "pacer.h"
#include "replay.h"
#include "wire.h"

#define BIT_GET(bm, i) (((bm)[(i) >> 3] >> ((i) & 7)) & 1u)
#define BIT_SET(bm, i) ((bm)[(i) >> 3] |= (uint8_t)(1u << ((i) & 7)))
#define WIRE_OVERHEAD 42          /* IPv4 + UDP + Ethernet bytes on the link, for pacing and rates */
/* Datagrams between the first and the last reply that an ACK-based rate needs: the receiver ACKs
 * every 32, so two ACK intervals at least. */
#define ACK_RATE_MIN_DGRAMS 64
#define CNT(eng, field, n) __atomic_fetch_add(&(eng)->counters.field, (uint64_t)(n), __ATOMIC_RELAXED)

/* A message being received. */
struct rx {
    struct rx *next;
    uint16_t sender, pass;
    uint32_t msg;
    struct sockaddr_in src;
    uint32_t nchunks, chunk, meta_len, meta_chunks, meta_received, received;
    uint64_t cap, total;          /* cap = nchunks * chunk; total known once the end arrived */
    uint8_t *base, *flat, *bitmap; /* owned; base from eng->rxpool, written where chunks arrived */
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
    uint8_t *base, *bitmap;       /* owned; base from the engine's rxpool (bufpool_give) */
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
    struct pacer uplink;          /* the whole engine's sending (cfg.uplink_rate; 0: unpaced) */
    uint64_t last_sweep_ns, rng;
    uint8_t *rbuf, *sbuf;         /* owned: receive slots (datagram.c), staging copies (batch.c) */
    struct bufpool *rxpool;       /* a reference: received messages' buffers, reused across rounds */
    struct batch *batch;          /* owned: sendmmsg scratch (batch.c) */
    struct auth auth;             /* tags on what it sends and receives */
    struct auth_stream group_stream; /* IVs of what it sends to its multicast group (auth.h) */
    struct replay replay;         /* what it already received */
    struct mcast mc;              /* multicast socket and memberships (mc.fd -1: multicast off) */
    /* settings */
    p2p_config cfg;
    struct sockaddr_in local;
    p2p_counters counters;
};

/* api.c: what the units share */
uint64_t now_ns(void);
/* Bytes of each segment covered by the chunks set in bitmap. */
void segment_coverage(const uint8_t *bitmap, uint32_t nchunks, uint32_t chunk, uint64_t meta_len,
                      const uint64_t *seg_off, const uint64_t *seg_len, uint32_t nseg, uint64_t *out);
/* host:port into *out; 0, or a negative errno with p2p_last_error set. */
int parse_ipv4(const char *host, uint16_t port, struct sockaddr_in *out);
/* Wakes the I/O thread (new commands, closing). */
void engine_wake(p2p_engine *eng);
/* With eng->mu held: waits on eng->cv until ready(arg), for timeout_ms (< 0: forever, 0: not at all). */
void engine_wait(p2p_engine *eng, int (*ready)(const void *), const void *arg, int timeout_ms);
void engine_unref(p2p_engine *eng);
/* delivery.c: the delivery queue. With mu held: dq_push puts d, delivered from `src`, at its end and
 * makes it fit its quotas, returning what it dropped (for the caller to free once it unlocked);
 * dq_remove takes d (the one after prev; prev NULL: the head) off it and out of its quotas. */
struct delivery_priv *dq_push(p2p_engine *eng, struct delivery_priv *d, const struct sockaddr_in *src);
void dq_remove(p2p_engine *eng, struct delivery_priv *d, struct delivery_priv *prev);
/* Frees deliveries linked through next. */
void deliveries_free(struct delivery_priv *list);

/* io.c: the I/O thread (tx.c and rx.c are its parts, see io.h) */
int io_init(p2p_engine *eng);
void *io_main(void *arg);
void io_finish_all(p2p_engine *eng);

#endif
