/* The time and rate model the planner is judged by (planner.h): a link carries rate x (T - start)
 * by T, a receiver's CPU merges (T - up_start) / merge_cost messages by T (at most max_fanin), and a
 * sender's uplink counts copies: the first receiver in its multicast domain costs one (the
 * group's), the others in the domain nothing, each receiver outside one. From these: what each
 * peer can take and send by T, the T of a plan, and the bounds step 1 bisects between.
 * Capacities get a relative REL_EPS of slack, so that loads equal to T x capacity fit despite
 * rounding.
 */
#include <math.h>
#include <stddef.h>

#include "planner.h"

#define UPPER_MARGIN 1e-6 /* relative: an upper bound on T above every start by more than its rounding */

/* Time a link has within T once it is free (0 if it never is). */
static double window(double T, double start) {
    return T > start ? T - start : 0.0;
}

/* What receiver j's downlink takes by T: messages (equal sizes) or bytes. */
double model_fanin(const struct planner *pl, int j, double T) {
    double bytes = pl->down[j] * window(T, pl->down_start[j]) * (1 + REL_EPS);
    return pl->equal ? floor(bytes / pl->msg[j]) : bytes;
}

/* Messages receiver j can merge by T: its CPU merges from up_start, merge_cost each; max_fanin. */
double model_merges(const struct planner *pl, int j, double T) {
    double m = INFINITY;
    if (pl->merge_cost && pl->merge_cost[j] > 0)
        m = floor(window(T, pl->up_start[j]) * (1 + REL_EPS) / pl->merge_cost[j]);
    return pl->max_fanin > 0 ? fmin(m, pl->max_fanin) : m;
}

/* What sender i's uplink carries by T, in copies of its message (at most live: never binding). */
double model_copies(const struct planner *pl, int i, double T) {
    return fmin(floor(pl->up[i] * window(T, pl->up_start[i]) * (1 + REL_EPS) / pl->msg[i]), pl->live);
}

/* Copies receiver j costs sender i: 0 in its domain once the group has one, else 1. */
static double copy_cost(const struct planner *pl, int i, int j, const struct budget *b) {
    return same_domain(pl, i, j) && b->group ? 0 : 1;
}

/* While i's group has no copy and its copies cannot reach `left` receivers one by one, it keeps one
 * for the group (which reaches all its mates); otherwise any receiver will do, in or outside its
 * domain. */
int budget_affordable(const struct planner *pl, int i, int j, const struct budget *b, int left) {
    int keep = !b->group && !same_domain(pl, i, j) && pl->mates[i] > 0 && left > b->copies;
    return copy_cost(pl, i, j, b) + keep <= b->copies;
}

void budget_spend(const struct planner *pl, int i, int j, struct budget *b) {
    b->copies -= copy_cost(pl, i, j, b);
    if (same_domain(pl, i, j)) b->group = 1;
}

/* Without a multicast domain also what its uplink carries by T (in a domain, the budget counts
 * its copies as it takes receivers). */
int model_fanout(const struct planner *pl, int i, double T) {
    int lim = pl->live - 1;
    if (pl->max_fanout > 0 && pl->max_fanout < lim) lim = pl->max_fanout;
    if (pl->domain && pl->domain[i] >= 0) return lim;
    double c = model_copies(pl, i, T);
    return c < lim ? (int)c : lim;
}

/* Sender i's copy for receiver j: counted once per group, once per receiver outside it. */
static double add_copy(const struct planner *pl, int i, uint32_t j, int *group) {
    if (!same_domain(pl, i, (int)j)) return 1;
    double first = !*group;
    *group = 1;
    return first;
}

/* The largest start + load / capacity of any uplink, downlink or merge. */
double model_plan_time(struct planner *pl) {
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

/* A sender's own uplink after its start, and all bytes over all downlinks from the earliest
 * downlink start. */
double model_lower_bound(const struct planner *pl) {
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
double model_upper_bound(const struct planner *pl) {
    double T = model_lower_bound(pl), largest = pl->msg[pl->by_size_desc[0]];
    int most_senders = pl->max_fanin > 0 && pl->max_fanin < pl->live - 1 ? pl->max_fanin : pl->live - 1;
    for (int t = 0; t < pl->live; t++) {
        int j = pl->by_size_desc[t];
        T = fmax(T, pl->down_start[j] + most_senders * largest / pl->down[j]);
        T = fmax(T, pl->up_start[j] + pl->p * pl->msg[j] / pl->up[j]);
        if (pl->merge_cost) T = fmax(T, pl->up_start[j] + (pl->live - 1) * pl->merge_cost[j]);
    }
    return T * (1 + UPPER_MARGIN);
}
