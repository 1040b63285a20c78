/* The receivers' fan-in left (room, merges, cap) and the indexed max-heap that orders them by it
 * (planner.h). Step 1 takes the receivers with the most fan-in left (ties: those that still have
 * to send, then the round's random rank); step 2 (spread) those with the fewest senders so far.
 * The heap holds peer numbers; pos[] finds one in it, so a receiver leaves and re-enters in
 * O(log n) when its key changes.
 */
#include <math.h>

#include "planner.h"

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

void heap_push(struct planner *pl, int v) {
    heap_place(pl, pl->hn++, v);
    sift_up(pl, pl->hn - 1);
}

void heap_remove(struct planner *pl, int v) {
    int k = pl->pos[v], last = pl->heap[--pl->hn];
    pl->pos[v] = -1;
    if (k == pl->hn) return;
    heap_place(pl, k, last);
    sift_up(pl, k);
    sift_down(pl, pl->pos[last]);
}

void heap_order(struct planner *pl) {
    for (int k = pl->hn / 2 - 1; k >= 0; k--) sift_down(pl, k);
}

static void set_cap(struct planner *pl, int j) {
    pl->cap[j] = fmin(pl->room[j], pl->merges[j] * pl->unit);
}

void heap_took(struct planner *pl, int j, double c) {
    pl->room[j] -= c;
    pl->merges[j] -= 1;
    set_cap(pl, j);
}

void heap_reset(struct planner *pl, double T) {
    pl->hn = 0;
    if (pl->live) pl->unit = cost(pl, pl->by_size_desc[0]);
    for (int t = 0; t < pl->live; t++) {
        int j = pl->by_size_desc[t];
        pl->room[j] = model_fanin(pl, j, T);
        pl->merges[j] = model_merges(pl, j, T);
        set_cap(pl, j);
        pl->pending[j] = 1;
        heap_place(pl, pl->hn++, j);
    }
}

/* min(room, merges x unit): fan-in left in messages of about the current sender's size. */
void heap_rekey(struct planner *pl, double unit) {
    pl->unit = unit;
    for (int k = 0; k < pl->hn; k++) set_cap(pl, pl->heap[k]);
    heap_order(pl);
}
