/* p2pcast: a loss-tolerant multicast engine over UDP.
 *
 * This header is the engine's whole public API and is also the cffi cdef source: it holds plain
 * declarations only (the builder drops the #include lines; cffi understands <stdint.h> types).
 * The SELMCAST planner and the merge are a module of their own: compute.h.
 *
 * A message is a list of segments (e.g. one per tensor). On the wire it is one flat byte space:
 * [meta][segment 0][segment 1]..., each segment starting on an 8-byte boundary, cut into chunks
 * of `chunk_size` bytes that are addressed by index, sent and acknowledged in any order. The
 * meta (segment table + an opaque application blob) is always delivered exactly; each segment
 * may lose up to its loss bound before the send to a receiver closes early.
 *
 * IP multicast (mcast_port set): a receiver marked `multicast` gets the data through this sender's
 * group, sent once for all such receivers of the message (paced at the slowest one's rate); repairs
 * go to the group while on average each resent chunk serves two receivers or more, else by
 * unicast; a receiver the group does not reach falls back to unicast within the message.
 *
 * Threading: every function may be called from any thread. Functions that wait release
 * nothing themselves; cffi releases the GIL around every call.
 * Errors: functions return 0 on success and a negative errno-style code on failure;
 * p2p_last_error() gives a human-readable message for the calling thread's last failure.
 */
#include <stdint.h>

/* Largest chunk payload: a UDP datagram (65,507 bytes) less the 56-byte header, a multiple of 8. An
 * incoming message claims whole chunks: memory for up to this much more than its bytes. */
#define P2P_MAX_CHUNK 65448

#define P2P_FILL_ZERO 0
#define P2P_FILL_COPY 1

/* How a delivery came to be. */
#define P2P_DELIVERED_COMPLETE 0   /* every chunk arrived */
#define P2P_DELIVERED_CLOSED 1     /* the sender closed it (Early Close or its deadline) */
#define P2P_DELIVERED_EXPIRED 2    /* nothing heard from the sender for rx_idle_ms */

/* How the send to one receiver ended. */
#define P2P_SEND_PENDING 0
#define P2P_SEND_EXACT 1           /* every chunk acknowledged */
#define P2P_SEND_EARLY_CLOSED 2    /* closed with every segment within its loss bound */
#define P2P_SEND_DEADLINE 3        /* closed at the message deadline */
#define P2P_SEND_UNREACHABLE 4     /* the receiver stopped answering */
#define P2P_SEND_CANCELLED 5       /* the engine was closed first */
#define P2P_SEND_DUPLICATE 6       /* the same message id was already in flight to it */
#define P2P_SEND_SLOW 7            /* closed as slow: its arrivals put its end past slow_factor x its planned time */

typedef struct p2p_engine p2p_engine;
typedef struct p2p_send p2p_send;

typedef struct {
    const char *host;             /* IPv4 address to bind ("0.0.0.0" = all) */
    uint16_t port;                /* 0 = any free port */
    uint16_t sender_id;           /* this peer's id, carried in every datagram */
    uint32_t job_id;              /* the job's tag (p2plearn.keys.job_tag): another's datagrams are refused */
    uint8_t key[32];              /* the job's data key (AES-256-GMAC tags); all zero = tags off */
    uint32_t max_datagram;        /* UDP payload bytes; 0 = from each path's MTU */
    uint32_t window_bytes;        /* unacknowledged bytes in flight per receiver; 0 = 8 MiB */
    uint32_t rx_idle_ms;          /* deliver and free an incoming message silent this long; 0 = 5000 */
    uint64_t max_message_bytes;   /* largest incoming message accepted; 0 = 4 GiB */
    /* Quotas on incoming messages still being received: when a new one would exceed one, the
     * oldest (of that source, for the per-source quota) is dropped. Legitimate traffic never
     * comes near them unless a peer receives from hundreds of peers at once. */
    uint32_t max_partial_messages;  /* open at once, every source together; 0 = 1024 */
    uint32_t max_partial_per_source; /* open at once from one address and port; 0 = 64 */
    uint64_t max_partial_bytes;     /* bytes the open ones may claim together; 0 = 16 GiB */
    /* Quotas on delivered messages waiting for p2p_recv (the delivery queue), each claiming its whole
     * chunks as above: when a newly delivered one would exceed one, the oldest waiting delivery of the
     * source (address and port) holding the most of it is dropped, until it fits: a source never
     * loses a delivery to another that holds less than it (a flood drops the flooder's own first).
     * Its sender was already told that the message arrived. */
    uint32_t max_queued_messages;   /* waiting at once, every source together; 0 = max_partial_messages */
    uint64_t max_queued_bytes;      /* bytes they may claim together; 0 = max_partial_bytes */
    double uplink_rate;           /* bytes/s this peer may send in total; 0 = unpaced */
    double drop_prob;             /* drop incoming DATA with this probability (loss injection) */
    uint64_t seed;                /* for drop_prob */
    uint32_t socket_buffer;       /* SO_SNDBUF/SO_RCVBUF bytes; 0 = 32 MiB (forced when root) */
    int gso;                      /* use UDP GSO/GRO when the kernel has them (1) or not (0) */
    /* IP multicast: the same on every peer of a job. */
    uint16_t mcast_port;          /* port every peer receives multicast data on; 0 = multicast off */
    const char *mcast_group_base; /* first group; NULL = "239.77.0.0" (administratively scoped) */
    uint32_t mcast_groups;        /* sender i's group is base + i % mcast_groups; 0 = 65536 (one per sender) */
    uint8_t mcast_ttl;            /* hops a multicast datagram may cross; 0 = 1 (this LAN only) */
    uint32_t mcast_max_joined;    /* groups joined at once (quota); 0 = 16 */
} p2p_config;

typedef struct {
    const void *ptr;              /* caller's memory, read in place until the send completes */
    uint64_t len;
    double loss_bound;            /* fraction of this segment that may be missing, in [0, 1) */
} p2p_segment;

typedef struct {
    const char *host;             /* IPv4 address */
    uint16_t port;
    double rate;                  /* bytes/s to pace this receiver at; 0 = unpaced */
    int multicast;                /* 1: through this sender's group (needs mcast_port); 0: unicast */
} p2p_receiver;

typedef struct {
    uint32_t deadline_ms;         /* close whatever arrived after this long; 0 = no deadline */
    uint32_t chunk_size;          /* payload bytes per chunk; 0 = largest the paths allow */
    const void *app;              /* opaque descriptor delivered with the message (e.g. dtypes) */
    uint32_t app_len;
    /* Slow close, per paced receiver (rate > 0; a multicast member: at the pace its group sends at):
     * its planned time is the message's wire bytes at that pace. Its send closes with what arrived
     * (P2P_SEND_SLOW) at start + slow_factor x planned, or sooner once its first-pass ACKs project
     * its end past that (bytes its bounds still need at the arrival rate measured so far, judged
     * from 1/16 of the message and two ACK intervals on). 0 = off; else >= 1. */
    double slow_factor;
} p2p_send_options;

typedef struct {
    int result;                   /* P2P_SEND_* */
    uint64_t datagrams_sent;
    uint64_t datagrams_retransmitted;
    uint64_t datagrams_received;  /* as reported by the receiver */
    uint32_t passes;              /* transmission passes (1 = no retransmission) */
    double delivered;             /* fraction of the message's chunks acknowledged */
    double elapsed_s;
    double delivery_rate;         /* bytes per second that reached the receiver (every pass) */
    double ack_rate;              /* wire bytes/s arriving at the receiver in the first pass, from
                                   * its ACKs' spread (datagrams counted / time between replies);
                                   * not capped by the send's start or close; 0 = too few ACKs.
                                   * P2P_SEND_SLOW: the rate up to the close (its ACKs' spread over the
                                   * time from the first to the close; too few ACKs: the datagrams it
                                   * received over the whole send), what the close was judged on */
    double loss_rate;             /* 1 - received/sent datagrams */
    double rtt_s;                 /* smoothed probe round trip */
    int error;                    /* errno when the kernel refused to send there (UNREACHABLE), else 0 */
    int multicast;                /* 1: the group's datagrams reached it; 0: unicast only (not asked, or fell back) */
} p2p_receiver_stats;

typedef struct {
    uint16_t sender;              /* the sender's id */
    uint32_t msg_id;
    char src_host[16];            /* where the datagrams came from */
    uint16_t src_port;
    int reason;                   /* P2P_DELIVERED_* */
    int layout_known;             /* 0: the meta never arrived (sender died); segments unknown */
    uint32_t nseg;
    const uint64_t *seg_off;      /* offset of each segment inside `data` */
    const uint64_t *seg_len;
    const uint8_t *app;
    uint32_t app_len;
    uint8_t *data;                /* the segments, laid out by seg_off (engine memory) */
    uint64_t data_len;
    uint32_t chunk_size;
    uint32_t nchunks;
    uint32_t meta_len;            /* chunk k covers data bytes [k*chunk_size - meta_len, ...) */
    const uint8_t *chunk_mask;    /* bit k (LSB first) set = chunk k arrived */
    uint32_t chunks_received;
    uint64_t datagrams_received;
} p2p_delivery;

typedef struct {
    uint64_t bytes_sent;
    uint64_t datagrams_sent;
    uint64_t bytes_received;
    uint64_t datagrams_received;
    uint64_t retransmissions;
    uint64_t messages_sent;
    uint64_t messages_delivered;
    uint64_t messages_expired;
    uint64_t drop_bad_length;     /* shorter than a header, or fields disagree with the size */
    uint64_t drop_bad_magic;
    uint64_t drop_bad_version;
    uint64_t drop_bad_type;
    uint64_t drop_other_job;      /* another job's (its job tag) */
    uint64_t drop_bad_tag;        /* authentication failed: wrong key (another job's, or none), corrupted, or
                                   * sent to another receiver (a redirected replay) */
    uint64_t drop_replayed;       /* authentic but already received, or older than the last 2048 of its sender */
    uint64_t drop_bad_index;      /* chunk index, count or geometry out of range or inconsistent */
    uint64_t drop_bad_meta;       /* the message's segment table was invalid */
    uint64_t drop_unknown;        /* ACK/DONE for no message in flight */
    uint64_t drop_stale;          /* for a message already delivered */
    uint64_t drop_duplicate;      /* chunk already received */
    uint64_t drop_injected;       /* dropped on purpose by drop_prob */
    uint64_t drop_too_large;      /* larger than max_message_bytes */
    uint64_t drop_evicted;        /* partial messages dropped for a newer one (quotas above) */
    uint64_t drop_queue_full;     /* delivered messages dropped unread: the delivery queue's quotas (max_queued_*) */
    uint64_t ack_limited;         /* ACKs not sent: 3x the bytes the message brought in (anti-amplification) */
    uint64_t send_errors;         /* sends the kernel refused (EACCES, ENETUNREACH, ...): receiver ended */
    uint64_t slow_closed;         /* sends to a receiver that ended P2P_SEND_SLOW */
    uint64_t mcast_datagrams_sent; /* DATA datagrams sent to a group (each counted once in datagrams_sent) */
    uint64_t mcast_datagrams_received; /* datagrams that arrived through a group */
    uint64_t mcast_refused;       /* announced messages this engine could not join the group of (got them by unicast) */
    uint64_t drop_not_member;     /* multicast DATA for a message not announced to this engine */
    uint64_t rx_buffers_allocated; /* receive buffers of 256 KiB or more allocated anew, none kept fitting
                                   * (bufpool.c); flat across rounds once the pool holds a round's sizes */
    /* Gauges, not counters: incoming messages still being received now, and their bytes still to come;
     * delivered messages waiting for p2p_recv, and the bytes they claim (max_queued_*). */
    uint64_t receiving_messages;
    uint64_t receiving_bytes;
    uint64_t queued_messages;
    uint64_t queued_bytes;
} p2p_counters;

const char *p2p_last_error(void);
void p2p_config_default(p2p_config *cfg);

int p2p_engine_open(const p2p_config *cfg, p2p_engine **out);
/* Stops the I/O thread and closes the socket; sends in flight end as P2P_SEND_CANCELLED, undelivered
 * messages are freed, and callers blocked in p2p_recv return -ESHUTDOWN. The engine's memory lives
 * until the last reference goes: the caller's (dropped here), each send's, and each hold's. */
void p2p_engine_close(p2p_engine *eng);
/* A reference for a call made while another thread may close the engine (p2p_recv, p2p_send_start,
 * p2p_engine_counters): take it before the call, release it after. */
void p2p_engine_hold(p2p_engine *eng);
void p2p_engine_release(p2p_engine *eng);
int p2p_engine_address(p2p_engine *eng, char *host_out, uint16_t *port_out);
void p2p_engine_counters(p2p_engine *eng, p2p_counters *out);
/* Largest payload per chunk the path to host allows (from the route's MTU). */
int p2p_path_chunk_size(p2p_engine *eng, const char *host, uint32_t *out);

int p2p_send_start(p2p_engine *eng, uint32_t msg_id,
                   const p2p_segment *segs, uint32_t nseg,
                   const p2p_receiver *rcv, uint32_t nrcv,
                   const p2p_send_options *opt, p2p_send **out);
/* 0 = every receiver finished, 1 = timeout (timeout_ms < 0 waits forever). */
int p2p_send_wait(p2p_send *s, int timeout_ms);
int p2p_send_receiver_stats(p2p_send *s, uint32_t receiver, p2p_receiver_stats *out,
                            double *segment_fractions, uint32_t nseg);
/* Drop the caller's reference; the engine keeps its own until the send finishes. */
void p2p_send_release(p2p_send *s);

/* 0 = a delivery in *out, 1 = timeout, negative = engine closed. */
int p2p_recv(p2p_engine *eng, int timeout_ms, p2p_delivery **out);
void p2p_delivery_free(p2p_delivery *d);
/* Bubble filling: write where chunks are missing, per segment: zeros, or the bytes at the same
 * offsets of src[i] (the receiver's own values, or the sender's previous message). */
int p2p_fill(p2p_delivery *d, int mode, const p2p_segment *src, uint32_t nsrc);
/* Fraction of each segment's bytes that arrived. */
int p2p_delivery_fractions(const p2p_delivery *d, double *out, uint32_t nseg);

/* The datagram tags' MAC, for tests and for checking another implementation: AES-256-GMAC under
 * `key` and the 96-bit `iv` over the pieces' bytes in order (their loss_bound unused), through the
 * engine's GHASH (portable = 0: ghash.c where the CPU runs it) or OpenSSL's (portable = 1). */
int p2p_gmac(const uint8_t key[32], const uint8_t iv[12], const p2p_segment *pieces, uint32_t n, int portable,
             uint8_t tag[16]);
