/* The SELMCAST planner, the mask-aware merge and compression: plain computations on the caller's arrays, a
 * module of their own (p2plearn._p2pcompute) apart from the engine (p2pcast.h), so that selection
 * and merging need no transport.
 *
 * This header is the module's whole API and its cffi cdef source: plain declarations only (the
 * builder drops the #include lines; cffi understands <stdint.h> types).
 *
 * Threading: every function may be called from any thread; none keeps state between calls, and
 * cffi releases the GIL around every call.
 * Errors: functions return 0 on success and a negative errno-style code on failure;
 * p2p_last_error() gives a human-readable message for the calling thread's last failure.
 */
#include <stdint.h>

const char *p2p_last_error(void);

/* ---- SELMCAST receiver selection (planner.c) ----
 * Peer i has available uplink[i] and downlink[i] (bytes/s) and sends message_bytes[i] this round;
 * its uplink is free from up_start[i] seconds into the round (after its compute), its downlink
 * from down_start[i] (after what is still arriving): a link carries rate * (T - start) by T. Its
 * CPU merges the messages it receives one after another from up_start[i], merge_cost[i] seconds
 * each (NULL: merging is free), so by T it can merge (T - up_start[i]) / merge_cost[i] of them.
 * A sender's uplink carries one copy per receiver, except that one copy to an IP multicast group
 * reaches every receiver in the sender's multicast domain: mcast_domain[i] >= 0 names it (peers
 * with the same value reach each other), -1 = unicast only, NULL = unicast everywhere.
 * The plan gives each live sender at least min(p, live - 1) distinct live receivers, never itself,
 * minimising T = the latest start + load / capacity of any uplink, downlink or merge, then adding
 * receivers beyond p while T does not grow. max_fanout caps the receivers per sender, max_fanin
 * the senders per receiver (0 = no cap, else >= p). Then every live peer still without a sender
 * gets one by moving an edge from a receiver that has two or more, where it takes the message by
 * T (1 + mixing_slack) (0: T does not grow). (seed, round) break ties, so that each round leaves
 * out other peers. Rates and sizes must be finite and >= 0, and > 0 for live peers
 * (alive[i] != 0); starts and merge costs in [0, 1e6] seconds. On success *out owns its arrays: free
 * them with p2p_plan_free. */
typedef struct {
    int n;
    const double *uplink, *downlink, *message_bytes;   /* per peer; borrowed for the call */
    const double *up_start, *down_start;               /* seconds into the round */
    const double *merge_cost;                          /* seconds per merged message, or NULL */
    const int32_t *mcast_domain;                       /* multicast domain per peer, or NULL */
    const uint8_t *alive;
} p2p_view;

typedef struct {
    int n;
    double time;                  /* T(plan), seconds */
    int64_t *offsets;             /* n + 1: sender i's receivers are receivers[offsets[i] .. offsets[i + 1]) */
    uint32_t *receivers;
} p2p_plan;

int p2p_plan_make(const p2p_view *view, int p, int max_fanout, int max_fanin, double mixing_slack,
                  uint64_t seed, uint64_t round, p2p_plan *out);
void p2p_plan_free(p2p_plan *plan);

/* ---- Mask-aware merging (merge.c) ----
 * p2p_merge averages one tensor in place with k senders' values for it: each element becomes the
 * mean of its own value and the contributions' values for it that arrived (a lost chunk never
 * drags an element anywhere). A contribution's element e arrived when the chunk holding it did
 * (chunk_arrived[(first_byte + the offset of e's byte) / chunk_size] != 0; first_byte is where values[0]
 * sits in the message's chunk numbering: meta_len + the segment's offset) and, with an element
 * mask, when element_arrived[e] != 0; NULL for either means everything arrived. Sums in double.
 * *arrived_out: the fraction of (element, contribution) pairs that arrived. A contribution whose
 * arrays are shorter than n elements need (values_bytes, nscales), or that reaches past its chunks,
 * is refused (EINVAL) before anything changes.
 * A contribution with finite_only set refuses a value that is not finite (NaN, inf), and every value
 * of a block whose scale is not finite or would read a code past float32's range (|scale| x 128 for
 * int8, x 8 for int4, above FLT_MAX): they count as not arrived, and refused_out[i] (k entries, or
 * NULL) says how many of contribution i's that arrived were refused so.
 * p2p_decode reads one contribution's n elements as float32 into out, the merge's way: usable[e] = 1
 * where element e arrived and was not refused (out[e] = 0 where not); *refused_out as above.
 * p2p_place puts them in place: out[e] = base[e] + that float32 value (base NULL: the value) where
 * element e arrived and was not refused; out keeps its own value elsewhere. base may be out itself.
 * p2p_merge_fold is p2p_merge taken over several calls (merging as senders' data arrives): each call
 * adds k more contributions to fold's running sums, and the call with finish set (k may be 0) also
 * divides and writes the tensor. Contributions added in the order one p2p_merge would take them give
 * the same bits. fold's arrays are the caller's: sum and count n doubles each, whole and state one
 * per P2P_MERGE_BLOCK elements; state zeroed before the first call (a finishing call leaves it zeroed
 * for the next merge); sum, count and whole need no initialising (a block's are written when the
 * block is first touched, and a block finished without an earlier call never touches them). The
 * tensor is read when a block is first touched and written only when finishing. *arrived_out: this
 * call's (element, contribution) pairs that arrived, a count; refused_out as p2p_merge's, this call's. */
#define P2P_F32 0
#define P2P_F64 1
#define P2P_F16 2
#define P2P_BF16 3
#define P2P_I8 4                  /* contributions only: value of element e = q[e] * scales[e / block] */
#define P2P_I4 5                  /* contributions only: 4-bit codes, two per byte (element 2i in the low
                                     nibble of byte i, 2i + 1 in the high one; (n + 1) / 2 bytes): value of
                                     element e = (code - 8) * scales[e / block]; senders use codes 1..15 */

typedef struct {
    const void *values;           /* n elements of dtype (the caller's memory, read only) */
    uint64_t values_bytes;        /* bytes at values: at least what n elements of dtype take */
    int dtype;                    /* P2P_* */
    const float *scales;          /* P2P_I8, P2P_I4 only: one per block of values (the caller's) */
    uint64_t nscales;             /* at least ceil(n / block) */
    uint32_t block;
    const uint8_t *chunk_arrived; /* one byte per chunk of the message, or NULL (the caller's) */
    uint64_t nchunks;
    uint64_t first_byte;
    uint32_t chunk_size;
    const uint8_t *element_arrived; /* n bytes, or NULL (the caller's) */
    int finite_only;              /* nonzero: refuse non-finite values and scales that do not fit */
} p2p_contribution;

int p2p_merge(void *own, int own_dtype, uint64_t n, const p2p_contribution *contribs, uint32_t k,
              double *arrived_out, uint64_t *refused_out);
#define P2P_MERGE_BLOCK 2048

typedef struct {
    double *sum;                  /* n: the running sums of the blocks begun */
    double *count;                /* n: per element, arrivals of contributions that did not bring its whole block */
    double *whole;                /* per block: the own value + contributions that brought the whole block */
    uint8_t *state;               /* per block: 0 not begun, 1 sum live, 2 sum and count live */
} p2p_fold;

int p2p_merge_fold(void *own, int own_dtype, uint64_t n, p2p_fold *fold, const p2p_contribution *contribs,
                   uint32_t k, int finish, uint64_t *arrived_out, uint64_t *refused_out);
int p2p_decode(const p2p_contribution *c, uint64_t n, float *out, uint8_t *usable, uint64_t *refused_out);
int p2p_place(const p2p_contribution *c, uint64_t n, float *out, const float *base, uint64_t *refused_out);

/* ---- Compression (quantize.c) ----
 * p2p_quantize encodes n values in one of the formats that travel, in one pass and in place of the
 * caller's arrays (none allocated): x[e] = values[e] (dtype P2P_F32, P2P_F64, P2P_F16 or P2P_BF16
 * bits, read as float32) - anchor[e] (float32 differences; no anchor: nothing subtracted) + residual[e]
 * (float32 sums; no residual: nothing added), then in `format`:
 *   P2P_F16: x clipped to +-65504, rounded to nearest even (2 bytes per value at codes);
 *   P2P_BF16: x rounded to nearest even, a NaN as 0x7fc0 (2 bytes);
 *   P2P_I8 / P2P_I4: per block of `block` values (the last may be shorter), scales[b] = max |x| / 127
 *     (int8) or / 7 (int4), 1 where that is 0, NaN where a value is; code = x / scale rounded to
 *     nearest even (-127..127, -7..7); int4 codes are packed as P2P_I4 reads them (code + 8).
 * read[e], what a receiver reads of element e (code x scale, or the fp16/bf16 value), goes to
 * decoded[e] when decoded is not NULL; residual[e] becomes x[e] - read[e] (error feedback). Bit for
 * bit what the numpy encoder of sync/compress.py did before, NaN and inf included (but a NaN's bits
 * where numpy's own pick depends on its SIMD lanes: see quantize.c). The arrays must not overlap;
 * each is checked against n (EINVAL before anything is written); block at most 2048. */
typedef struct {
    const void *values;           /* n elements of dtype (the caller's, read only) */
    uint64_t values_bytes;
    int dtype;                    /* P2P_F32, P2P_F64, P2P_F16, P2P_BF16 */
    const float *anchor;          /* n floats (dtype P2P_F32 only), or NULL: x = values - anchor, a change */
    uint64_t nanchor;
    float *residual;              /* n floats, read and updated in place, or NULL: no error feedback */
    uint64_t nresidual;
    int format;                   /* P2P_F16, P2P_BF16, P2P_I8, P2P_I4 */
    void *codes;                  /* value_bytes(format, n) bytes: (n + 1) / 2 for P2P_I4 */
    uint64_t codes_bytes;
    float *scales;                /* P2P_I8, P2P_I4 only: ceil(n / block) */
    uint64_t nscales;
    uint32_t block;
    float *decoded;               /* n floats, or NULL */
    uint64_t ndecoded;
} p2p_quantize_job;

int p2p_quantize(const p2p_quantize_job *job, uint64_t n);

/* ---- The size of a change (change.c) ----
 * p2p_change_sumsq: *out = the sum over e < n of (now[e] - before[e])^2, both of dtype (P2P_F32,
 * P2P_F64, P2P_F16 or P2P_BF16 bits), in double; the tracking of update norms, in one read-only pass. */
int p2p_change_sumsq(const void *now, const void *before, int dtype, uint64_t n, double *out);

/* ---- Robust merging (robust.c) ----
 * p2p_robust_merge merges one tensor in place like p2p_merge (the same contributions, chunk and
 * element masks, formats and finite_only refusals: what did not arrive or was refused does not
 * count), but bounds what any one sender can do to the receiver's model:
 * P2P_ROBUST_CLIP, centered clipping (CenteredClip, Karimireddy et al. 2021; ClippedGossip, He et
 *   al. 2022) of each sender's difference from the receiver's own values, tile by tile (tiles of
 *   P2P_ROBUST_TILE elements): in tile t, contribution j's difference d_j over its m_j elements that
 *   arrived is kept (s_j = 1) while |d_j| <= multiplier x mu_t sqrt(m_j), and scaled down to
 *   min(multiplier, 1) x mu_t sqrt(m_j) beyond (s_j the ratio: a clipped sender moves the receiver
 *   no further than a typical one); each element becomes own + sum_j s_j d_j[e] / (1 + the senders
 *   that arrived there). mu_t, the typical RMS distance per element, is the median of the tile's
 *   history (history[h * tiles + t], h < nhistory; negative entries skipped) and this call's tile
 *   median: the lower median of the contributions' RMS distances sqrt(|d_j|^2 / m_j) (-1 where none
 *   arrived), which tile_median_out[t] returns.
 * P2P_ROBUST_TRIMMED, a coordinate-wise trimmed mean: each element becomes the mean of its own value
 *   and those that arrived, less the `trim` largest and `trim` smallest (min(trim, (m - 1) / 2) of m).
 * out (k entries, or NULL), per sender: distance2, the squared distance of its values that counted
 * from own; kept2, what of it the merge used (clip: s_j^2 |d_j|^2; trimmed: of the values kept);
 * arrived, its elements that counted; clipped, its elements in tiles where s_j < 1 (trimmed: its
 * values trimmed); refused, as p2p_merge's refused_out. Contributions are checked as p2p_merge checks
 * them (EINVAL before anything changes); ENOMEM when the tile scratch (trimmed: 24 KiB a sender) cannot be
 * had. Clipping costs about what the plain merge does per byte (python -m p2plearn.bench merge). */
#define P2P_ROBUST_CLIP 1
#define P2P_ROBUST_TRIMMED 2
#define P2P_ROBUST_TILE 1024

typedef struct {
    int mode;                     /* P2P_ROBUST_* */
    double multiplier;            /* CLIP: the radius over the median RMS distance, beyond which a row is clipped; > 0 */
    const double *history;        /* CLIP: nhistory rows of ceil(n / P2P_ROBUST_TILE) tile medians, or NULL */
    uint32_t nhistory;
    double *tile_median_out;      /* CLIP: ceil(n / P2P_ROBUST_TILE) entries, or NULL */
    uint32_t trim;                /* TRIMMED: values dropped at each end of an element's sorted values */
} p2p_robust;

typedef struct {
    double distance2, kept2;
    uint64_t arrived, clipped, refused;
} p2p_robust_sender;

int p2p_robust_merge(void *own, int own_dtype, uint64_t n, const p2p_contribution *contribs, uint32_t k,
                     const p2p_robust *how, p2p_robust_sender *out);

/* ---- The DDP hook's randomized Hadamard transform (hadamard.c) ----
 * p2p_hadamard: each block of `block` floats of x (n a multiple of it; block a power of 2) becomes
 * H D x / sqrt(block) (inverse = 0) or D H x / sqrt(block) (inverse != 0, which undoes it), in place:
 * H the Walsh-Hadamard matrix, D random signs drawn from seed per element of x (the same for one
 * seed everywhere). */
int p2p_hadamard(float *x, uint64_t n, uint32_t block, uint64_t seed, int inverse);
