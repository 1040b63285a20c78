/* SELMCAST receiver selection, steps 1 to 3: who each sender multicasts to this round (planner.h;
 * API in compute.h).
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
 * wants one by one (budget_affordable).
 * Cost: O(bisection steps x passes x E log n) for E receivers in all.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "planner.h"

#define MAX_STEPS 200  /* bisection: from DBL_MIN to DBL_MAX to within REL_EPS takes about 41 */
#define MAX_SWAP_TRIES 4096 /* step 3: donor edges looked at per peer without a sender (bounds its cost) */
/* Passes of step 1's greedy per T with unequal sizes: PASS_BUDGET / live, within [MIN, MAX]. */
#define PASS_BUDGET 4096
#define MIN_PASSES 4
#define MAX_PASSES 256
/* On views of up to this many live peers, every other random-order pass is best fit (O(live) per
 * pick): tight packings that worst fit misses in every order, best fit often finds. */
#define BEST_FIT_LIVE 64
/* Step 1 orders receivers by fan-in left in messages of about the current sender's size: re-keyed
 * when a sender's message is larger or below this fraction of the size keyed for. */
#define REKEY_BELOW 0.5

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
        if (pl->stamp[j] == (uint32_t)i + 1 || !budget_affordable(pl, i, j, b, want - got)) continue;
        budget_spend(pl, i, j, b);
        heap_took(pl, j, c);
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
            if (dup || !budget_affordable(pl, i, j, b, want - got)) continue;
            if (best < 0 || pl->cap[j] < pl->cap[best] || pl->rank[j] > pl->rank[best]) best = j;
        }
        if (best < 0) break;
        heap_remove(pl, best);
        budget_spend(pl, i, best, b);
        heap_took(pl, best, c);
        heap_push(pl, best);
        out[got++] = (uint32_t)best;
    }
    heap_push(pl, i);
    return got;
}

/* Step 1's question: can every live sender get p receivers at T? Fills base[]. With unequal sizes
 * a failed pass is retried: MIN_PASSES times with the sender that failed moved first ("squeaky
 * wheel"), then in random orders, more often on small views where tight packings are common and
 * passes cheap, every other one best fit on views of up to BEST_FIT_LIVE peers. Receivers are
 * keyed by fan-in left in messages of about the current sender's size (heap_rekey): keyed by the
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
        heap_reset(pl, T);
        heap_order(pl);
        for (; t < pl->live; t++) {
            int i = pl->order[t];
            struct budget b = {model_copies(pl, i, T), 0};
            if (cost(pl, i) > pl->unit || cost(pl, i) < pl->unit * REKEY_BELOW) heap_rekey(pl, cost(pl, i));
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
    heap_reset(pl, T);
    memset(pl->senders, 0, sizeof(int) * (size_t)pl->n);
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_desc[t];
        for (int k = 0; k < pl->p; k++) {
            uint32_t j = pl->base[(size_t)i * pl->p + k];
            heap_took(pl, (int)j, cost(pl, i));
            pl->senders[j]++;
        }
    }
    pl->spread = 1;
    heap_order(pl);
    for (int t = 0; t < pl->live; t++) {
        int i = pl->by_size_asc[t], want = model_fanout(pl, i, T) - pl->p;
        struct budget b = {model_copies(pl, i, T), 0};
        for (int k = 0; k < pl->p; k++) budget_spend(pl, i, (int)pl->base[(size_t)i * pl->p + k], &b);
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
        double room = model_fanin(pl, j, Tj); /* j has nothing yet */
        if (model_merges(pl, j, Tj) < 1) continue;
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

int planner_solve(struct planner *pl, double *T_out) {
    double lo = model_lower_bound(pl), hi = lo;
    int ok = assign_p(pl, lo);
    if (!ok) {
        hi = model_upper_bound(pl);
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
    double T = model_plan_time(pl);
    int rc = add_extras(pl, T);
    if (!rc) rc = cover_starved(pl, T);
    *T_out = model_plan_time(pl);
    if (!rc && !isfinite(*T_out))
        return set_error(EINVAL, "plan: rates and sizes out of range (a round would take %g s)", *T_out);
    return rc;
}
