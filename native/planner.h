/* The SELMCAST planner's units and what they share (API: p2p_plan_make in compute.h).
 *
 * planner.c checks the caller's view, owns the scratch memory and packs the plan; planner_steps.c
 * solves (step 1: the smallest T at which every live sender gets p receivers; step 2: extras at
 * that T; step 3: a sender for every peer still without one); planner_model.c is the time and
 * rate model they are judged by (what each link and CPU carries by T, a sender's uplink copies, the
 * T of a plan and bounds on it); planner_heap.c keeps each receiver's fan-in left and orders the
 * receivers by it. One call owns one struct planner, on one thread: nothing here is shared.
 */
#ifndef P2P_PLANNER_H
#define P2P_PLANNER_H
#include <stdint.h>

#define REL_EPS 1e-9   /* slack on capacities: loads equal to T x capacity must fit despite rounding */

/* One p2p_plan_make call's state. Borrowed: the caller's view, n entries each, read only for the
 * call. Owned: the scratch arrays, allocated by planner_init (n entries each unless said) and
 * freed by planner_free. */
struct planner {
    int n, live, p, max_fanout, max_fanin; /* p: clamped to live - 1 by planner_init */
    double mixing_slack;        /* step 3 may let T grow by this fraction to give a peer a sender */
    int equal;                  /* all live messages equal: fan-in counts whole messages, exactly */
    double unit;                /* the message cost cap[] counts in: the largest message's (1 with equal
                                 * sizes) after heap_reset, about the current sender's after heap_rekey */
    const double *up, *down, *msg;                  /* borrowed: rates (bytes/s), message bytes */
    const double *up_start, *down_start; /* borrowed: seconds into the round before each link is free */
    const double *merge_cost;   /* borrowed: seconds per merged message, or NULL */
    const int32_t *domain;      /* borrowed: multicast domain, -1 none; NULL = unicast */
    const uint8_t *alive;       /* borrowed */
    int *mates;                 /* owned: live peers in the same multicast domain, not counting itself */
    uint64_t *rank;             /* owned: random tie-break per peer, from (seed, round) */
    uint64_t shuffle_seed;      /* for step 1's random orders, also from (seed, round) */
    int *by_size_desc, *by_size_asc;   /* owned: the live peers, live entries used */
    int *order;                 /* owned: step 1's sender order in the current pass, live entries used */
    double *room;               /* owned: downlink left per receiver: messages (equal) or bytes */
    double *merges;             /* owned: messages left that a receiver can merge (INFINITY: no bound) */
    double *cap;                /* owned: fan-in left: min(room, merges x unit), what the heap orders by */
    uint8_t *pending;           /* owned: the peer has not had its turn as a sender yet */
    int *heap, *pos, hn;        /* owned: max-heap of hn receivers by (cap, pending, rank); pos -1 = out */
    int *aside;                 /* owned: receivers popped during one sender's turn */
    uint32_t *base;             /* owned, n x p + 1: step 1: p receivers per sender, at base[i * p] */
    uint32_t *stamp;            /* owned: stamp[j] == i + 1: j already receives from i */
    int spread;                 /* step 2: the heap puts receivers with the fewest senders first */
    int *senders;               /* owned: steps 2 and 3: senders each receiver has so far */
    uint32_t *extra;            /* owned, extra_cap entries (grown by step 2): step 2 receivers, contiguous
                                 * per sender, nextra used */
    int64_t nextra, extra_cap;
    int64_t *extra_at;          /* owned: where sender i's extras start in extra[] */
    int *nextra_of;             /* owned: how many extras sender i has */
};

/* Uplink copies sender i may still send; group: one went to its domain's group already. */
struct budget { double copies; int group; };

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* What sender i's message costs a receiver's fan-in: 1 (equal sizes) or its bytes. */
static inline double cost(const struct planner *pl, int i) { return pl->equal ? 1.0 : pl->msg[i]; }

static inline int same_domain(const struct planner *pl, int i, int j) {
    return pl->domain && pl->domain[i] >= 0 && pl->domain[i] == pl->domain[j];
}

/* planner_steps.c: steps 1 to 3 on an initialised planner; *T_out: the plan's T. 0 or -errno. */
int planner_solve(struct planner *pl, double *T_out);

/* planner_model.c: capacities by T (fan-in in messages or bytes, merges in messages, copies) */
double model_fanin(const struct planner *pl, int j, double T);
double model_merges(const struct planner *pl, int j, double T);
double model_copies(const struct planner *pl, int i, double T);
/* Receivers sender i may have at T (at most live - 1 and max_fanout). */
int model_fanout(const struct planner *pl, int i, double T);
/* T of the current plan (base + extras). Uses cap[] and room[] as scratch. */
double model_plan_time(struct planner *pl);
/* No T below the lower bound can work; at the upper one, step 1's greedy does not fail. */
double model_lower_bound(const struct planner *pl);
double model_upper_bound(const struct planner *pl);
/* Whether i can send to j within budget b when it still wants `left` receivers; spending it. */
int budget_affordable(const struct planner *pl, int i, int j, const struct budget *b, int left);
void budget_spend(const struct planner *pl, int i, int j, struct budget *b);

/* planner_heap.c: the receivers' fan-in left, and the heap that orders them by it */
/* Fan-in of every live receiver at T, every peer pending, all in the heap (not yet ordered). */
void heap_reset(struct planner *pl, double T);
/* Orders the whole heap (after heap_reset, or after keys changed). */
void heap_order(struct planner *pl);
/* Re-keys every receiver in the heap by fan-in left in messages of `unit` bytes, and orders it. */
void heap_rekey(struct planner *pl, double unit);
void heap_push(struct planner *pl, int v);
void heap_remove(struct planner *pl, int v);
/* Receiver j takes a message of cost c: its fan-in left drops (out of the heap, or re-placed after). */
void heap_took(struct planner *pl, int j, double c);

#endif
