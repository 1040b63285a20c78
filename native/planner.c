/* SELMCAST receiver selection: who each sender multicasts to this round (see compute.h).
 *
 * Step 1 (bottleneck first): the smallest T at which every live sender gets p receivers.
 * "Feasible at T" is a degree-constrained bipartite assignment without self-loops; a sorted greedy
 * decides it: senders in decreasing message size each take the p receivers with the most fan-in
 * left (ties: receivers that still have to send first, since they cannot use their own fan-in;
 * then a per-round random rank). With equal sizes fan-in counts whole messages and this is the
 * Kleitman-Wang construction adapted to fan-in bounds: exact in every comparison with an ILP.
 * With unequal sizes fan-in is a byte budget (bin packing, NP-hard): the greedy is worst-fit
 * decreasing, retried in other orders and best fit on small views (assign_p), near-exact. T is
 * found by geometric bisection to a relative 1e-9 between the best lower bound and a T at which
 * every receiver can take as many of the largest messages as it may have senders.
 * Step 2 (Pareto extras): within the capacities at the T of step 1's plan, senders in
 * increasing message size (smallest first maximises the count) each add receivers up to their
 * fan-out capacity, those with the fewest senders so far that still hold the message (spread:
 * that is what makes the extras mix), so T does not grow. Step 3 (mixing): a
 * live peer still without a sender takes an edge from a receiver that has two or more
 * (cover_starved), again at no cost in T.
 * Merging: a receiver's fan-in is also bounded by the messages its CPU merges by T (merge_cost) and
 * by max_fanin; both enter every step as a count of messages left, next to the bytes left.
 * Multicast domains: a sender's uplink budget is counted in copies; the first receiver in its
 * domain costs one (the group's), the others in the domain nothing, each receiver outside one. A
 * sender keeps a copy for its group only while its copies cannot reach the receivers it still
 * wants one by one (affordable).
 * Cost: O(bisection steps x passes x E log n) for E receivers in all.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute.h"
#include "error.h"

#define REL_EPS 1e-9   /* slack on capacities: loads equal to T x capacity must fit despite rounding */
#define UPPER_MARGIN 1e-6 /* relative: an upper bound on T above every start by more than its rounding */
#define MAX_STEPS 200  /* bisection: from DBL_MIN to DBL_MAX to within REL_EPS takes about 41 */
/* Start times and merge costs above this (11.6 days into a round) are corrupt reports, not load. */
#define MAX_SECONDS 1e6
#define MAX_SWAP_TRIES 4096 /* step 3: donor edges looked at per peer without a sender (bounds its cost) */
/* Passes of step 1's greedy per T with unequal sizes: PASS_BUDGET / live, within [MIN, MAX]. */
#define PASS_BUDGET 4096
#define MIN_PASSES 4
/* On views of up to this many live peers, every other random-order pass is best fit (O(live) per
 * pick): tight packings that worst fit misses in every order, best fit often finds. */
#define BEST_FIT_LIVE 64
/* Step 1 orders receivers by fan-in left in messages of about the current sender's size: re-keyed
 * when a sender's message is larger or below this fraction of the size keyed for. */
#define REKEY_BELOW 0.5
#define MAX_PASSES 256

struct planner {
    int n, live, p, max_fanout, max_fanin;
    double mixing_slack;        /* step 3 may let T grow by this fraction to give a peer a sender */
    int equal;                  /* all live messages equal: fan-in counts whole messages, exactly */
    double unit;                /* cost of the largest message: 1 (equal) or its bytes */
    const double *up, *down, *msg;
    const double *up_start, *down_start; /* seconds into the round before each link is free */
    const double *merge_cost;   /* seconds per merged message, or NULL (borrowed) */
    const int32_t *domain;      /* multicast domain, -1 none; NULL = unicast (borrowed) */
    const uint8_t *alive;
    int *mates;                 /* live peers in the same multicast domain, not counting itself */
    uint64_t *rank;             /* random tie-break per peer, from (seed, round) */
    uint64_t shuffle_seed;      /* for step 1's random orders, also from (seed, round) */
    int *by_size_desc, *by_size_asc;   /* live peers */
    int *order;                 /* step 1's sender order in the current pass */
    double *room;               /* downlink left per receiver: messages (equal) or bytes */
    double *merges;             /* messages left that a receiver can merge (INFINITY: no bound) */
    double *cap;                /* fan-in left: min(room, merges x unit), what the heap orders by */
    uint8_t *pending;           /* the peer has not had its turn as a sender yet */
    int *heap, *pos, hn;        /* max-heap of receivers by (cap, pending, rank); pos -1 = out */
    int *aside;                 /* receivers popped during one sender's turn */
    uint32_t *base;             /* step 1: p receivers per sender, at base[i * p] */
    uint32_t *stamp;            /* stamp[j] == i + 1: j already receives from i */
    int spread;                 /* step 2: the heap puts receivers with the fewest senders first */
    int *senders;               /* steps 2 and 3: senders each receiver has so far */
    uint32_t *extra;            /* step 2 receivers, contiguous per sender */
    int64_t nextra, extra_cap, *extra_at;
    int *nextra_of;
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double cost(const struct planner *pl, int i) { return pl->equal ? 1.0 : pl->msg[i]; }

/* ---- indexed max-heap of receivers ---- */

static int better(const struct planner *pl, int a, int b) {
    if (pl->spread && pl->senders[a] != pl->senders[b]) return pl->senders[a] < pl->senders[b];
    if (pl->cap[a] != pl->cap[b]) return pl->cap[a] > pl->cap[b];
    if (pl->pending[a] != pl->pending[b]) return pl->pending[a] > pl->pending[b];
    return pl->rank[a] > pl->rank[b];
}

static void heap_place(struct planner *pl, int k, int v) {
    pl->heap[k] = v;
    pl->pos[v] = k;
}

static void sift_up(struct planner *pl, int k) {
    int v = pl->heap[k];
    while (k > 0 && better(pl, v, pl->heap[(k - 1) / 2])) {
        heap_place(pl, k, pl->heap[(k - 1) / 2]);
        k = (k - 1) / 2;
    }
    heap_place(pl, k, v);
}

static void sift_down(struct planner *pl, int k) {
    int v = pl->heap[k];
    for (;;) {
        int c = 2 * k + 1;
        if (c >= pl->hn) break;
        if (c + 1 < pl->hn && better(pl, pl->heap[c + 1], pl->heap[c])) c++;
        if (!better(pl, pl->heap[c], v)) break;
        heap_place(pl, k, pl->heap[c]);
        k = c;
    }
    heap_place(pl, k, v);
}

static void heap_push(struct planner *pl, int v) {
    heap_place(pl, pl->hn++, v);
    sift_up(pl, pl->hn - 1);
}

static void heap_remove(struct planner *pl, int v) {
    int k = pl->pos[v], last = pl->heap[--pl->hn];
    pl->pos[v] = -1;
    if (k == pl->hn) return;
    heap_place(pl, k, last);
    sift_up(pl, k);
    sift_down(pl, pl->pos[last]);
}

/* Time a link has within T once it is free (0 if it never is). */
static double window(double T, double start) {
    return T > start ? T - start : 0.0;
}

/* What receiver j's downlink takes by T: messages (equal sizes) or bytes. */
static double fanin(const struct planner *pl, int j, double T) {
    double bytes = pl->down[j] * window(T, pl->down_start[j]) * (1 + REL_EPS);
    return pl->equal ? floor(bytes / pl->msg[j]) : bytes;
}

/* Messages receiver j can merge by T: its CPU merges from up_start, merge_cost each; max_fanin. */
static double merges(const struct planner *pl, int j, double T) {
    double m = INFINITY;
    if (pl->merge_cost && pl->merge_cost[j] > 0)
        m = floor(window(T, pl->up_start[j]) * (1 + REL_EPS) / pl->merge_cost[j]);
    return pl->max_fanin > 0 ? fmin(m, pl->max_fanin) : m;
}

static void set_cap(struct planner *pl, int j) {
    pl->cap[j] = fmin(pl->room[j], pl->merges[j] * pl->unit);
}

/* Receiver j takes a message of cost c. */
static void took(struct planner *pl, int j, double c) {
    pl->room[j] -= c;
    pl->merges[j] -= 1;
    set_cap(pl, j);
}

/* Fan-in of every live receiver at T, every peer pending, all in the heap (not yet ordered). */
static void reset(struct planner *pl, double T) {
    pl->hn = 0;
    if (pl->live) pl->unit = cost(pl, pl->by_size_desc[0]);
    for (int t = 0; t < pl->live; t++) {
        int j = pl->by_size_desc[t];
        pl->room[j] = fanin(pl, j, T);
        pl->merges[j] = merges(pl, j, T);
        set_cap(pl, j);
        pl->pending[j] = 1;
        heap_place(pl, pl->hn++, j);
    }
}

/* Uplink copies sender i may still send; group: one went to its domain's group already. */
struct budget { double copies; int group; };

/* What sender i's uplink carries by T, in copies of its message (at most live: never binding). */
static double copies(const struct planner *pl, int i, double T) {
    return fmin(floor(pl->up[i] * window(T, pl->up_start[i]) * (1 + REL_EPS) / pl->msg[i]), pl->live);
}

static int same_domain(const struct planner *pl, int i, int j) {
    return pl->domain && pl->domain[i] >= 0 && pl->domain[i] == pl->domain[j];
}

/* Copies receiver j costs sender i: 0 in its domain once the group has one, else 1. */
static double copy_cost(const struct planner *pl, int i, int j, const struct budget *b) {
    return same_domain(pl, i, j) && b->group ? 0 : 1;
}

/* Whether i can send to j within its budget when it still wants `left` receivers. While its group
 * has no copy and its copies cannot reach `left` receivers one by one, it keeps one for the group
 * (which reaches all its mates); otherwise any receiver will do, in or outside its domain. */
static int affordable(const struct planner *pl, int i, int j, const struct budget *b, int left) {
    int keep = !b->group && !same_domain(pl, i, j) && pl->mates[i] > 0 && left > b->copies;
    return copy_cost(pl, i, j, b) + keep <= b->copies;
}

static void spend(const struct planner *pl, int i, int j, struct budget *b) {
    b->copies -= copy_cost(pl, i, j, b);
    if (same_domain(pl, i, j)) b->group = 1;
}

/* Sender i's turn: it takes up to `want` receivers from the top of the heap within its uplink
 * budget b, skipping itself and those stamped for it; picks go to out[]. Returns how many it got. */
static int take(struct planner *pl, int i, int want, struct budget *b, uint32_t *out) {
    int got = 0, nset = 0;
    double c = cost(pl, i);
    pl->pending[i] = 0;
    if (pl->pos[i] >= 0) heap_remove(pl, i);
    /* Step 1: the top has the most fan-in left, so once it cannot hold the message nobody can.
     * Step 2 (spread): the top has the fewest senders; one that cannot hold this message cannot
     * hold any later sender's either (they come by increasing size), so it leaves the heap. */
    while (got < want && pl->hn > 0 && (pl->spread || pl->cap[pl->heap[0]] >= c) && (b->copies >= 1 || b->group)) {
        int j = pl->heap[0];
        heap_remove(pl, j);
        if (pl->cap[j] < c) continue;
        pl->aside[nset++] = j;
        if (pl->stamp[j] == (uint32_t)i + 1 || !affordable(pl, i, j, b, want - got)) continue;
        spend(pl, i, j, b);
        took(pl, j, c);
        if (pl->spread) pl->senders[j]++;
        out[got++] = (uint32_t)j;
    }
    for (int k = 0; k < nset; k++) heap_push(pl, pl->aside[k]);
    heap_push(pl, i);
    return got;
}

/* Best fit: sender i takes, one by one, the receiver with the least fan-in left that still holds
 * its message (the heap stays ordered: each pick leaves and re-enters it). O(live) per pick. */
static int take_tightest(struct planner *pl, int i, int want, struct budget *b, uint32_t *out) {
    int got = 0;
    double c = cost(pl, i);
    pl->pending[i] = 0;
    if (pl->pos[i] >= 0) heap_remove(pl, i);
    while (got < want && (b->copies >= 1 || b->group)) {
        int best = -1;
        for (int k = 0; k < pl->hn; k++) {
            int j = pl->heap[k], dup = 0;
            if (pl->cap[j] < c || (best >= 0 && pl->cap[j] > pl->cap[best])) continue;
            for (int g = 0; g < got; g++) dup |= out[g] == (uint32_t)j;
            if (dup || !affordable(pl, i, j, b, want - got)) continue;
            if (best < 0 || pl->cap[j] < pl->cap[best] || pl->rank[j] > pl->rank[best]) best = j;
        }
        if (best < 0) break;
        heap_remove(pl, best);
        spend(pl, i, best, b);
        took(pl, best, c);
        heap_push(pl, best);
        out[got++] = (uint32_t)best;
    }
    heap_push(pl, i);
    return got;
}

static void heapify(struct planner *pl) {
    for (int k = pl->hn / 2 - 1; k >= 0; k--) sift_down(pl, k);
}

/* Receivers sender i may have at T: at most live - 1 and max_fanout, and without a multicast
 * domain what its uplink carries by T (in a domain, take() counts its copies). */
static int fanout(const struct planner *pl, int i, double T) {
    int lim = pl->live - 1;
    if (pl->max_fanout > 0 && pl->max_fanout < lim) lim = pl->max_fanout;
    if (pl->domain && pl->domain[i] >= 0) return lim;
    double c = copies(pl, i, T);
    return c < lim ? (int)c : lim;
}

/* Orders the heap by fan-in left in messages of `unit` bytes: min(room, merges x unit). */
static void rekey(struct planner *pl, double unit) {
    pl->unit = unit;
    for (int k = 0; k < pl->hn; k++) set_cap(pl, pl->heap[k]);
    heapify(pl);
}

/* Step 1's question: can every live sender get p receivers at T? Fills base[]. With unequal sizes
 * a failed pass is retried: MIN_PASSES times with the sender that failed moved first ("squeaky
 * wheel"), then in random orders, more often on small views where tight packings are common and
 * passes cheap, every other one best fit on views of up to BEST_FIT_LIVE peers. Receivers are
 * keyed by fan-in left in messages of about the current sender's size (rekey): keyed by the
 * largest message, a receiver with few merges left but bytes to spare outranked one that could
 * still take many small messages, and binding fan-in caps cost up to 4.7x the optimal T. */
static int assign_p(struct planner *pl, double T) {
    int passes = pl->equal ? 1 : MAX_PASSES;
    uint64_t s = pl->shuffle_seed;   /* the same draws for every T: the answer depends on T alone */
    if (passes > 1 && pl->live > PASS_BUDGET / MAX_PASSES)
        passes = pl->live > PASS_BUDGET / MIN_PASSES ? MIN_PASSES : PASS_BUDGET / pl->live;
    memcpy(pl->order, pl->by_size_desc, sizeof(int) * (size_t)pl->live);
    for (int pass = 0; pass < passes; pass++) {
        int t = 0;
        for (int k = pl->live - 1; pass >= MIN_PASSES && k > 0; k--) {
            int r = (int)(splitmix64(&s) % (uint64_t)(k + 1)), v = pl->order[k];
            pl->order[k] = pl->order[r];
            pl->order[r] = v;
        }
        reset(pl, T);
        heapify(pl);
        for (; t < pl->live; t++) {
            int i = pl->order[t];
            struct budget b = {copies(pl, i, T), 0};
            if (cost(pl, i) > pl->unit || cost(pl, i) < pl->unit * REKEY_BELOW) rekey(pl, cost(pl, i));
            int best_fit = pass >= MIN_PASSES && pass % 2 && pl->live <= BEST_FIT_LIVE;
            if ((best_fit ? take_tightest : take)(pl, i, pl->p, &b, pl->base + (size_t)i * pl->p) < pl->p) break;
        }
        if (t == pl->live) return 1;
        int failed = pl->order[t];
        memmove(pl->order + 1, pl->order, sizeof(int) * (size_t)t);
        pl->order[0] = failed;
    }
    return 0;
}

/* Step 2: receivers beyond p, within the capacities at T that the step 1 plan leaves. */
static int add_extras(struct planner *pl, double T) {
    reset(pl, T);
    memset(pl->senders, 0, sizeof(int) * (size_t)pl->n);
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t];
        for (int k = 0; k < pl->p; k++) {
            uint32_t j = pl->base[(size_t)i * pl->p + k];
            took(pl, (int)j, cost(pl, i));
            pl->senders[j]++;
        }
    }
    pl->spread = 1;
    heapify(pl);
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_asc[t], want = fanout(pl, i, T) - pl->p;
        struct budget b = {copies(pl, i, T), 0};
        for (int k = 0; k < pl->p; k++) spend(pl, i, (int)pl->base[(size_t)i * pl->p + k], &b);
        if (pl->nextra + want > pl->extra_cap) {
            int64_t c = 2 * (pl->nextra + want);
            uint32_t *e = realloc(pl->extra, sizeof(uint32_t) * (size_t)c);
            if (!e) return set_error(ENOMEM, "out of memory");
            pl->extra = e;
            pl->extra_cap = c;
        }
        for (int k = 0; k < pl->p; k++) pl->stamp[pl->base[(size_t)i * pl->p + k]] = (uint32_t)i + 1;
        pl->extra_at[i] = pl->nextra;
        pl->nextra_of[i] = take(pl, i, want, &b, pl->extra + pl->nextra);
        pl->nextra += pl->nextra_of[i];
    }
    pl->spread = 0;
    return 0;
}

/* Sender i's copy for receiver j: counted once per group, once per receiver outside it. */
static double add_copy(const struct planner *pl, int i, uint32_t j, int *group) {
    if (!same_domain(pl, i, (int)j)) return 1;
    double first = !*group;
    *group = 1;
    return first;
}

/* T of the current plan (base + extras): the largest start + load / capacity of any uplink,
 * downlink or merge. Uses cap[] and room[] as scratch. */
static double current_time(struct planner *pl) {
    double T = 0, *down_load = pl->cap, *received = pl->room;
    for (int j = 0; j < pl->n; j++) down_load[j] = received[j] = 0;
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t], k = pl->p + pl->nextra_of[i], group = 0;
        double sent = 0;
        if (k == 0) continue;
        for (int r = 0; r < k; r++) {
            uint32_t j = r < pl->p ? pl->base[(size_t)i * pl->p + r] : pl->extra[pl->extra_at[i] + r - pl->p];
            sent += add_copy(pl, i, j, &group);
            down_load[j] += pl->msg[i];
            received[j] += 1;
        }
        T = fmax(T, pl->up_start[i] + sent * pl->msg[i] / pl->up[i]);
    }
    for (int j = 0; j < pl->n; j++) {
        if (down_load[j] > 0) T = fmax(T, pl->down_start[j] + down_load[j] / pl->down[j]);
        if (received[j] > 0 && pl->merge_cost) T = fmax(T, pl->up_start[j] + received[j] * pl->merge_cost[j]);
    }
    return T;
}

/* Fewest copies sender i's uplink carries for p receivers: one for its group if the domain has
 * p others, else the group's and one per receiver outside it. */
static double min_copies(const struct planner *pl, int i) {
    if (!pl->domain || pl->domain[i] < 0 || pl->mates[i] == 0) return pl->p;
    return pl->mates[i] >= pl->p ? 1 : 1 + pl->p - pl->mates[i];
}

/* No T below this can work: a sender's own uplink after its start, and all bytes over all
 * downlinks from the earliest downlink start. */
static double lower_bound(const struct planner *pl) {
    double T = 0, bytes = 0, down = 0, first = INFINITY;
    if (pl->p == 0) return 0;
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t];
        T = fmax(T, pl->up_start[i] + min_copies(pl, i) * pl->msg[i] / pl->up[i]);
        bytes += pl->p * pl->msg[i];
        down += pl->down[i];
        first = fmin(first, pl->down_start[i]);
    }
    return fmax(T, first + bytes / down);
}

/* Here every receiver can take and merge as many of the largest messages as it may have senders
 * (live - 1, at most max_fanin) and every sender send p copies: no byte budget binds, fan-in is a
 * count that is the same for everyone, and step 1's greedy (Kleitman-Wang on counts) does not fail.
 * The margin keeps that true in rounding: a transfer shorter than a start time's last digit
 * vanishes in start + transfer. */
static double upper_bound(const struct planner *pl) {
    double T = lower_bound(pl), largest = pl->msg[pl->by_size_desc[0]];
    int most_senders = pl->max_fanin > 0 && pl->max_fanin < pl->live - 1 ? pl->max_fanin : pl->live - 1;
    for (int t = 0; t < pl->live; t++) {
        int j = pl->by_size_desc[t];
        T = fmax(T, pl->down_start[j] + most_senders * largest / pl->down[j]);
        T = fmax(T, pl->up_start[j] + pl->p * pl->msg[j] / pl->up[j]);
        if (pl->merge_cost) T = fmax(T, pl->up_start[j] + (pl->live - 1) * pl->merge_cost[j]);
    }
    return T * (1 + UPPER_MARGIN);
}

/* Step 3 (mixing): a live peer that step 1 and 2 left without a sender takes one by an edge swap:
 * an edge i -> k whose receiver k has another sender moves to j, when j's downlink takes i's
 * message by T (1 + mixing_slack). No receiver loses its last sender, no uplink carries more, and
 * T grows by at most mixing_slack (not at all by default). Edges are tried in a random order per
 * round, so the senders that give one up rotate. A peer whose downlink cannot take any message by
 * then stays without. */
static int cover_starved(struct planner *pl, double T) {
    int64_t E = (int64_t)pl->live * pl->p + pl->nextra;
    if (pl->p == 0 || E == 0) return 0;
    int *indeg = pl->senders; /* as step 2 left it: every receiver's senders */
    int *from = malloc(sizeof(int) * (size_t)E);
    uint32_t **slot = malloc(sizeof(uint32_t *) * (size_t)E);
    if (!from || !slot) {
        free(from); free(slot);
        return set_error(ENOMEM, "out of memory");
    }
    int64_t e = 0;
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t];
        for (int k = 0; k < pl->p; k++, e++) {
            slot[e] = &pl->base[(size_t)i * pl->p + k];
            from[e] = i;
        }
        for (int k = 0; k < pl->nextra_of[i]; k++, e++) {
            slot[e] = &pl->extra[pl->extra_at[i] + k];
            from[e] = i;
        }
    }
    uint64_t s = pl->shuffle_seed ^ 0x5A17C0FFEEull;
    for (int64_t k = E - 1; k > 0; k--) {
        int64_t r = (int64_t)(splitmix64(&s) % (uint64_t)(k + 1));
        uint32_t *ts = slot[k]; slot[k] = slot[r]; slot[r] = ts;
        int tf = from[k]; from[k] = from[r]; from[r] = tf;
    }
    int64_t front = 0; /* edges before it can never be given up again: their receiver has one sender */
    for (int t = 0; t < pl->live; t++) {
        int j = pl->by_size_desc[t];
        if (indeg[j] > 0) continue;
        double Tj = T * (1 + pl->mixing_slack);
        double room = fanin(pl, j, Tj); /* j has nothing yet */
        if (merges(pl, j, Tj) < 1) continue;
        while (front < E && indeg[*slot[front]] < 2) front++;
        for (int64_t x = front, tried = 0; x < E && tried < MAX_SWAP_TRIES; x++) {
            int i = from[x], k = (int)*slot[x];
            if (indeg[k] < 2) continue;
            tried++;
            /* a multicast sender may not trade a receiver in its group for a copy outside it */
            if (i == j || room < cost(pl, i) || (same_domain(pl, i, k) && !same_domain(pl, i, j))) continue;
            *slot[x] = (uint32_t)j;
            indeg[k]--;
            indeg[j]++;
            break;
        }
    }
    free(from); free(slot);
    return 0;
}

static int solve(struct planner *pl, double *T_out) {
    double lo = lower_bound(pl), hi = lo;
    int ok = assign_p(pl, lo);
    if (!ok) {
        hi = upper_bound(pl);
        if (!isfinite(hi)) return set_error(EINVAL, "plan: rates and sizes out of range (a round would take %g s)", hi);
        lo = fmax(lo, DBL_MIN); /* an underflowed bound: a geometric mean with 0 would never move */
        for (int step = 0; step < MAX_STEPS && hi > lo * (1 + REL_EPS); step++) {
            /* geometric, the bounds can be orders of magnitude apart; two roots cannot overflow */
            double mid = sqrt(lo) * sqrt(hi);
            ok = assign_p(pl, mid);
            if (ok) hi = mid; else lo = mid;
        }
        if (!ok && !assign_p(pl, hi)) return set_error(EDOM, "planner: no plan at the upper bound");
    }
    double T = current_time(pl);
    int rc = add_extras(pl, T);
    if (!rc) rc = cover_starved(pl, T);
    *T_out = current_time(pl);
    if (!rc && !isfinite(*T_out))
        return set_error(EINVAL, "plan: rates and sizes out of range (a round would take %g s)", *T_out);
    return rc;
}

struct sort_item { double m; uint64_t rank; int i; };

static int by_size_then_rank(const void *a, const void *b) {
    const struct sort_item *x = a, *y = b;
    if (x->m != y->m) return x->m < y->m ? 1 : -1;
    return x->rank < y->rank ? 1 : x->rank > y->rank ? -1 : 0;
}

static int check_array(const double *v, int n, const uint8_t *alive, const char *name) {
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]) || v[i] < 0)
            return set_error(EINVAL, "%s[%d] = %g: must be finite and >= 0", name, i, v[i]);
        if (alive[i] && v[i] == 0)
            return set_error(EINVAL, "%s[%d] = 0 for a live peer: must be > 0", name, i);
    }
    return 0;
}

/* Start times and merge costs: in [0, MAX_SECONDS] (0 for a live peer is fine: its link is free
 * from the start, its merges free). */
static int check_starts(const double *v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!(v[i] >= 0 && v[i] <= MAX_SECONDS))
            return set_error(EINVAL, "%s[%d] = %g: must be in [0, %g] seconds", name, i, v[i], MAX_SECONDS);
    return 0;
}

static int validate(const p2p_view *v, int p, int max_fanout, int max_fanin, double mixing_slack,
                    const p2p_plan *out) {
    if (!v || !out || !v->uplink || !v->downlink || !v->message_bytes || !v->up_start || !v->down_start || !v->alive)
        return set_error(EINVAL, "plan: NULL argument");
    int n = v->n;
    if (n <= 0) return set_error(EINVAL, "plan: n must be > 0, got %d", n);
    if (p < 0) return set_error(EINVAL, "plan: p must be >= 0, got %d", p);
    if (max_fanout < 0 || (max_fanout > 0 && max_fanout < p))
        return set_error(EINVAL, "plan: max_fanout must be 0 (no cap) or >= p = %d, got %d", p, max_fanout);
    if (max_fanin < 0 || (max_fanin > 0 && max_fanin < p))
        return set_error(EINVAL, "plan: max_fanin must be 0 (no cap) or >= p = %d, got %d", p, max_fanin);
    if (!(mixing_slack >= 0 && mixing_slack <= 1e6))
        return set_error(EINVAL, "plan: mixing_slack must be in [0, 1e6], got %g", mixing_slack);
    int rc;
    if ((rc = check_array(v->uplink, n, v->alive, "uplink")) || (rc = check_array(v->downlink, n, v->alive, "downlink")) ||
        (rc = check_array(v->message_bytes, n, v->alive, "message_bytes")) ||
        (rc = check_starts(v->up_start, n, "up_start")) || (rc = check_starts(v->down_start, n, "down_start")) ||
        (v->merge_cost && (rc = check_starts(v->merge_cost, n, "merge_cost"))))
        return rc;
    for (int i = 0; v->mcast_domain && i < n; i++)
        if (v->mcast_domain[i] < -1)
            return set_error(EINVAL, "mcast_domain[%d] = %d: must be >= 0, or -1 for none", i, (int)v->mcast_domain[i]);
    return 0;
}

static void planner_free(struct planner *pl) {
    free(pl->rank); free(pl->by_size_desc); free(pl->by_size_asc); free(pl->order);
    free(pl->cap); free(pl->room); free(pl->merges); free(pl->mates); free(pl->pending);
    free(pl->heap); free(pl->pos); free(pl->aside); free(pl->base); free(pl->stamp); free(pl->extra);
    free(pl->extra_at); free(pl->nextra_of); free(pl->senders);
}

/* mates[i]: live peers sharing i's multicast domain (peers sorted by domain, counted per run). */
static int count_mates(struct planner *pl) {
    struct sort_item *by_domain = malloc(sizeof *by_domain * (size_t)(pl->live + 1));
    if (!by_domain) return set_error(ENOMEM, "out of memory");
    int m = 0;
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t];
        if (pl->domain[i] >= 0) by_domain[m++] = (struct sort_item){pl->domain[i], 0, i};
    }
    qsort(by_domain, (size_t)m, sizeof *by_domain, by_size_then_rank);
    for (int a = 0; a < m;) {
        int b = a;
        while (b < m && by_domain[b].m == by_domain[a].m) b++;
        for (int k = a; k < b; k++) pl->mates[by_domain[k].i] = b - a - 1;
        a = b;
    }
    free(by_domain);
    return 0;
}

/* Live peers sorted by message size (ties by the round's random rank), sizes compared. */
static int planner_init(struct planner *pl, uint64_t seed, uint64_t round) {
    int n = pl->n;
    uint64_t s = seed;
    s = splitmix64(&s) ^ round;
    pl->rank = malloc(sizeof(uint64_t) * (size_t)n);
    pl->by_size_desc = malloc(sizeof(int) * (size_t)n);
    pl->by_size_asc = malloc(sizeof(int) * (size_t)n);
    pl->order = malloc(sizeof(int) * (size_t)n);
    pl->cap = malloc(sizeof(double) * (size_t)n);
    pl->room = malloc(sizeof(double) * (size_t)n);
    pl->merges = malloc(sizeof(double) * (size_t)n);
    pl->mates = calloc((size_t)n, sizeof(int));
    pl->pending = malloc((size_t)n);
    pl->heap = malloc(sizeof(int) * (size_t)n);
    pl->pos = malloc(sizeof(int) * (size_t)n);
    pl->aside = malloc(sizeof(int) * (size_t)n);
    pl->stamp = calloc((size_t)n, sizeof(uint32_t));
    pl->extra_at = calloc((size_t)n, sizeof(int64_t));
    pl->nextra_of = calloc((size_t)n, sizeof(int));
    pl->senders = calloc((size_t)n, sizeof(int));
    struct sort_item *items = malloc(sizeof *items * (size_t)n);
    if (!pl->rank || !pl->by_size_desc || !pl->by_size_asc || !pl->order || !pl->cap || !pl->room || !pl->merges ||
        !pl->mates || !pl->pending ||
        !pl->heap || !pl->pos || !pl->aside || !pl->stamp || !pl->extra_at || !pl->nextra_of || !pl->senders || !items) {
        free(items);
        return set_error(ENOMEM, "out of memory");
    }
    pl->live = 0;
    pl->shuffle_seed = splitmix64(&s);
    for (int i = 0; i < n; i++) {
        pl->rank[i] = splitmix64(&s);
        pl->pos[i] = -1;
        if (pl->alive[i]) items[pl->live++] = (struct sort_item){pl->msg[i], pl->rank[i], i};
    }
    qsort(items, (size_t)pl->live, sizeof *items, by_size_then_rank);
    pl->equal = 1;
    for (int t = 0; t < pl->live; t++) {
        pl->by_size_desc[t] = items[t].i;
        pl->by_size_asc[pl->live - 1 - t] = items[t].i;
        pl->equal &= items[t].m == items[0].m;
    }
    free(items);
    int rc;
    if (pl->domain && (rc = count_mates(pl))) return rc;
    if (pl->p > pl->live - 1) pl->p = pl->live > 0 ? pl->live - 1 : 0;
    pl->base = malloc(sizeof(uint32_t) * ((size_t)n * (size_t)pl->p + 1));
    return pl->base ? 0 : set_error(ENOMEM, "out of memory");
}

int p2p_plan_make(const p2p_view *view, int p, int max_fanout, int max_fanin, double mixing_slack,
                  uint64_t seed, uint64_t round, p2p_plan *out) {
    int rc = validate(view, p, max_fanout, max_fanin, mixing_slack, out);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    int n = view->n;
    const uint8_t *alive = view->alive;
    struct planner pl = {.n = n, .p = p, .max_fanout = max_fanout, .max_fanin = max_fanin,
                         .mixing_slack = mixing_slack, .up = view->uplink, .down = view->downlink,
                         .msg = view->message_bytes, .up_start = view->up_start, .down_start = view->down_start,
                         .merge_cost = view->merge_cost, .domain = view->mcast_domain, .alive = alive};
    if ((rc = planner_init(&pl, seed, round)) || (rc = solve(&pl, &out->time))) goto done;
    out->n = n;
    out->offsets = malloc(sizeof(int64_t) * ((size_t)n + 1));
    out->receivers = malloc(sizeof(uint32_t) * ((size_t)n * (size_t)pl.p + (size_t)pl.nextra + 1));
    if (!out->offsets || !out->receivers) {
        p2p_plan_free(out);
        rc = set_error(ENOMEM, "out of memory");
        goto done;
    }
    int64_t e = 0;
    for (int i = 0; i < n; i++) {
        out->offsets[i] = e;
        if (!alive[i]) continue;
        memcpy(out->receivers + e, pl.base + (size_t)i * pl.p, sizeof(uint32_t) * (size_t)pl.p);
        if (pl.nextra_of[i])
            memcpy(out->receivers + e + pl.p, pl.extra + pl.extra_at[i],
                   sizeof(uint32_t) * (size_t)pl.nextra_of[i]);
        e += pl.p + pl.nextra_of[i];
    }
    out->offsets[n] = e;
done:
    planner_free(&pl);
    return rc;
}

void p2p_plan_free(p2p_plan *plan) {
    if (!plan) return;
    free(plan->offsets);
    free(plan->receivers);
    memset(plan, 0, sizeof *plan);
}
