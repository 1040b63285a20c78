/* SELMCAST receiver selection's entry point (p2p_plan_make, compute.h): checks the caller's view,
 * allocates the planner's scratch memory (planner.h: what it owns and what it borrows), sorts the
 * live peers, has planner_steps.c solve, and packs the plan into the caller's p2p_plan.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute.h"
#include "error.h"
#include "planner.h"

/* Start times and merge costs above this (11.6 days into a round) are corrupt reports, not load. */
#define MAX_SECONDS 1e6

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
    if ((rc = planner_init(&pl, seed, round)) || (rc = planner_solve(&pl, &out->time))) goto done;
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
