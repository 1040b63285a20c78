/* Mask-aware merging: one tensor averaged in place with what senders sent for it.
 *
 * The tensor is walked in blocks small enough to stay in L1 (a sum per element); each contribution
 * adds its arrived runs to the block (a run is the part of a chunk inside the block, or single
 * elements under an element mask), and the block is written back once. A contribution that brings
 * every element of a block (the common case: nothing lost there, nothing to check one by one) is
 * added in one vectorised loop and counted once for the block; only the others keep a count per
 * element. Sums are in double: exact for every dtype that travels, float64 included, and the merge
 * is bound by reading the contributions, not by the adds. The counts are small integers, exact in
 * double, so the result does not depend on which contributions took which path.
 *
 * A contribution marked finite_only refuses, in the same pass, what would make a merge non-finite
 * (a member's NaN or inf): a value that is not finite, and every value of an int8 or int4 block
 * whose scale is not finite or would read a code as more than float32 holds. What it refuses counts
 * as not arrived, as a lost chunk does: the receiver keeps its own value there.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "compute.h"
#include "error.h"
#include "contribution.h"

#define BLOCK P2P_MERGE_BLOCK

VECTOR_CLONES static void divide(double *restrict sum, uint64_t len, double by) {
    for (uint64_t i = 0; i < len; i++) sum[i] /= by;
}

VECTOR_CLONES static void store_f32(float *restrict out, const double *restrict sum, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) out[i] = (float)sum[i];
}

/* read[i] += base[i] (float32, as numpy adds them). */
VECTOR_CLONES static void add_f32(float *restrict read, const float *restrict base, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) read[i] = base[i] + read[i];
}

/* Whether c brings every element of [start, end) and none is refused: no element mask, every
 * value finite where values are checked, every block's scale fits, every chunk there arrived. */
static int brings_all(const p2p_contribution *c, uint64_t start, uint64_t end) {
    if (c->element_arrived) return 0;
    if (checks_scales(c))
        for (uint64_t b = start / c->block; b <= (end - 1) / c->block; b++)
            if (!scale_fits(c, b)) return 0;
    if (c->chunk_arrived) {
        uint64_t first = (c->first_byte + byte_of(c->dtype, start)) / c->chunk_size;
        uint64_t last = (c->first_byte + byte_of(c->dtype, end - 1)) / c->chunk_size;
        if (memchr(c->chunk_arrived + first, 0, last - first + 1)) return 0;
    }
    return !checks_values(c) || all_finite(c, start, end);
}

/* sum[i] += value of element from + i, for i < len, and count[i] += 1 for each; returns how many
 * it added (all but the values checks_values refuses). */
static uint64_t add_run(double *sum, double *count, const p2p_contribution *c, uint64_t from, uint64_t len) {
    if (checks_values(c)) {
        uint64_t added = 0;
        for (uint64_t i = 0; i < len; i++) {
            double x = load(c->values, c->dtype, NULL, 0, from + i);
            if (!isfinite(x)) continue;
            sum[i] += x;
            count[i] += 1.0;
            added++;
        }
        return added;
    }
    add_values(sum, c, from, len);
    for (uint64_t i = 0; i < len; i++) count[i] += 1.0;
    return len;
}

/* Adds c's elements [start, end) that arrived and are not refused; returns how many did, and adds
 * to *refused how many arrived and were refused (finite_only). */
static uint64_t add_block(double *sum, double *count, const p2p_contribution *c, uint64_t start, uint64_t end,
                          uint64_t *refused) {
    uint64_t added = 0;
    for (uint64_t e = start; e < end;) {
        uint64_t run_end = end;
        int arrived = 1;
        if (c->chunk_arrived) {
            uint64_t k = (c->first_byte + byte_of(c->dtype, e)) / c->chunk_size;
            uint64_t chunk_end = first_at(c->dtype, (k + 1) * c->chunk_size - c->first_byte);
            if (chunk_end < run_end) run_end = chunk_end;
            arrived = c->chunk_arrived[k] != 0;
        }
        int usable = 1;
        if (checks_scales(c)) {  /* a run within one block: its scale is the run's */
            uint64_t block_end = (e / c->block + 1) * c->block;
            if (block_end < run_end) run_end = block_end;
            usable = scale_fits(c, e / c->block);
        }
        if (arrived && c->element_arrived) {
            for (uint64_t i = e; i < run_end; i++) {
                if (!c->element_arrived[i]) continue;
                if (!usable) {
                    (*refused)++;
                    continue;
                }
                double x = load(c->values, c->dtype, c->scales, c->block, i);
                if (checks_values(c) && !isfinite(x)) {
                    (*refused)++;
                    continue;
                }
                sum[i - start] += x;
                count[i - start] += 1.0;
                added++;
            }
        } else if (arrived) {
            uint64_t got = usable ? add_run(sum + (e - start), count + (e - start), c, e, run_end - e) : 0;
            added += got;
            *refused += run_end - e - got;
        }
        e = run_end;
    }
    return added;
}

/* The checks p2p_merge and p2p_merge_fold share. */
static int merge_check(const void *own, int own_dtype, uint64_t n, const p2p_contribution *contribs, uint32_t k) {
    if (own_dtype < P2P_F32 || own_dtype > P2P_BF16)
        return set_error(EINVAL, "merge: a tensor of dtype %d cannot be merged into", own_dtype);
    if (n && !own) return set_error(EINVAL, "merge: no tensor");
    if (k && !contribs) return set_error(EINVAL, "merge: no contributions");
    for (uint32_t i = 0; i < k; i++) {
        int rc = contribution_check(&contribs[i], n, i, "merge");
        if (rc) return rc;
    }
    return 0;
}

/* Adds k contributions to the blocks of own, each block's sums in fold's arrays (fold NULL, or a
 * block not begun when finishing: on the stack); finish: divides and writes own, and leaves the
 * blocks not begun. Returns the (element, contribution) pairs that arrived. */
static uint64_t merge_blocks(void *own, int own_dtype, uint64_t n, p2p_fold *fold, const p2p_contribution *contribs,
                             uint32_t k, int finish, uint64_t *refused_out) {
    double stack_sum[BLOCK], stack_partial[BLOCK];  /* partial: per element, how many of the others brought it */
    uint64_t arrived = 0, refused_here = 0;
    for (uint64_t start = 0; start < n; start += BLOCK) {
        uint64_t end = n - start < BLOCK ? n : start + BLOCK;
        uint64_t len = end - start, b = start / BLOCK;
        int state = fold ? fold->state[b] : 0;
        if (finish && !state && !k) continue;  /* nothing came for this block: own as it is */
        int kept = fold && (state || !finish);  /* whether the block's sums live in fold */
        double *sum = kept ? fold->sum + start : stack_sum, *partial = kept ? fold->count + start : stack_partial;
        double whole = 1.0;  /* the own value and every contribution that brought the whole block */
        if (state) {
            whole = fold->whole[b];
        } else if (own_dtype == P2P_F32) {
            load_f32(sum, (const float *)own + start, len);
        } else {
            for (uint64_t i = 0; i < len; i++) sum[i] = load(own, own_dtype, NULL, 0, start + i);
        }
        int counted = state == 2;  /* whether partial holds counts yet */
        for (uint32_t i = 0; i < k; i++) {
            const p2p_contribution *c = &contribs[i];
            if (brings_all(c, start, end)) {
                add_values(sum, c, start, len);
                whole += 1.0;
                arrived += len;
                continue;
            }
            if (!counted) memset(partial, 0, (size_t)len * sizeof *partial);
            counted = 1;
            arrived += add_block(sum, partial, c, start, end, refused_out ? &refused_out[i] : &refused_here);
        }
        if (!finish) {
            fold->whole[b] = whole;
            fold->state[b] = (uint8_t)(counted ? 2 : 1);
            continue;
        }
        if (counted)
            for (uint64_t i = 0; i < len; i++) sum[i] /= whole + partial[i];
        else
            divide(sum, len, whole);
        if (own_dtype == P2P_F32) {
            store_f32((float *)own + start, sum, len);
        } else {
            for (uint64_t i = 0; i < len; i++) store(own, own_dtype, start + i, sum[i]);
        }
        if (fold) fold->state[b] = 0;
    }
    return arrived;
}

int p2p_merge(void *own, int own_dtype, uint64_t n, const p2p_contribution *contribs, uint32_t k,
              double *arrived_out, uint64_t *refused_out) {
    int rc = merge_check(own, own_dtype, n, contribs, k);
    if (rc) return rc;
    if (arrived_out) *arrived_out = 1.0;
    if (refused_out) memset(refused_out, 0, (size_t)k * sizeof *refused_out);
    if (!k || !n) return 0;
    uint64_t arrived = merge_blocks(own, own_dtype, n, NULL, contribs, k, 1, refused_out);
    if (arrived_out) *arrived_out = (double)arrived / ((double)n * k);
    return 0;
}

int p2p_merge_fold(void *own, int own_dtype, uint64_t n, p2p_fold *fold, const p2p_contribution *contribs,
                   uint32_t k, int finish, uint64_t *arrived_out, uint64_t *refused_out) {
    int rc = merge_check(own, own_dtype, n, contribs, k);
    if (rc) return rc;
    if (!fold || (n && (!fold->sum || !fold->count || !fold->whole || !fold->state)))
        return set_error(EINVAL, "merge: a fold without its arrays");
    for (uint64_t b = 0; b < (n + BLOCK - 1) / BLOCK; b++)
        if (fold->state[b] > 2) return set_error(EINVAL, "merge: block %llu of the fold is in state %d",
                                                 (unsigned long long)b, fold->state[b]);
    if (refused_out) memset(refused_out, 0, (size_t)k * sizeof *refused_out);
    uint64_t arrived = n ? merge_blocks(own, own_dtype, n, fold, contribs, k, finish, refused_out) : 0;
    if (arrived_out) *arrived_out = arrived;
    return 0;
}

/* Reads c's elements [start, end) into sum (zeroed here) and, where c does not bring them all,
 * count (1 where an element arrived and was not refused); returns whether it brought them all. */
static int read_block(const p2p_contribution *c, uint64_t start, uint64_t end, double *sum, double *count,
                      uint64_t *refused) {
    uint64_t len = end - start;
    memset(sum, 0, (size_t)len * sizeof *sum);
    if (brings_all(c, start, end)) {
        add_values(sum, c, start, len);
        return 1;
    }
    memset(count, 0, (size_t)len * sizeof *count);
    add_block(sum, count, c, start, end, refused);
    return 0;
}

/* The checks p2p_decode and p2p_place share. */
static int read_check(const p2p_contribution *c, uint64_t n, const void *out, const char *what) {
    if (!c) return set_error(EINVAL, "%s: no contribution", what);
    int rc = contribution_check(c, n, 0, "merge");
    if (rc) return rc;
    if (n && !out) return set_error(EINVAL, "%s: no output", what);
    return 0;
}

int p2p_decode(const p2p_contribution *c, uint64_t n, float *out, uint8_t *usable, uint64_t *refused_out) {
    int rc = read_check(c, n, usable ? (const void *)out : NULL, "decode");
    if (rc) return rc;
    uint64_t refused = 0;
    double sum[BLOCK], count[BLOCK];
    for (uint64_t start = 0; start < n; start += BLOCK) {  /* the merge's walk, into zeros */
        uint64_t end = n - start < BLOCK ? n : start + BLOCK;
        uint64_t len = end - start;
        int all = read_block(c, start, end, sum, count, &refused);
        store_f32(out + start, sum, len);
        if (all)
            memset(usable + start, 1, len);
        else
            for (uint64_t i = 0; i < len; i++) usable[start + i] = count[i] != 0.0;
    }
    if (refused_out) *refused_out = refused;
    return 0;
}

int p2p_place(const p2p_contribution *c, uint64_t n, float *out, const float *base, uint64_t *refused_out) {
    int rc = read_check(c, n, out, "place");
    if (rc) return rc;
    uint64_t refused = 0;
    double sum[BLOCK], count[BLOCK];
    float read[BLOCK];
    for (uint64_t start = 0; start < n; start += BLOCK) {
        uint64_t end = n - start < BLOCK ? n : start + BLOCK;
        uint64_t len = end - start;
        int all = read_block(c, start, end, sum, count, &refused);
        store_f32(read, sum, len);
        if (base) add_f32(read, base + start, len);
        if (all)
            memcpy(out + start, read, (size_t)len * sizeof *read);
        else
            for (uint64_t i = 0; i < len; i++)
                if (count[i] != 0.0) out[start + i] = read[i];
    }
    if (refused_out) *refused_out = refused;
    return 0;
}
