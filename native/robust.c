/* Robust merging: one tensor merged in place so that no one sender can drag it far (see compute.h).
 *
 * The tensor is walked in tiles of P2P_ROBUST_TILE elements, which stay in cache. Clipping reads each
 * contribution's tile once, adding its difference from the receiver's own values to the tile's sum
 * unclipped while measuring its norm (float32 and int8 runs in one vectorised pass straight into the
 * sum; the other formats into a row first, through merge.c's readers, contribution.h); once every
 * sender's norm is known, the rare row that must be clipped is read again and what its scale cuts is
 * taken back. So an honest round costs one read of the contributions, as the plain merge. The trimmed
 * mean keeps every sender's row of the tile (3 x 8 KiB a sender) and sorts each element's values,
 * all of a tile's elements at once, row by row; where some sender missed elements, each element
 * then cuts by its own count, with masks.
 *
 * Clipping per tile rather than over the whole tensor keeps that one read (a whole-tensor radius
 * would need every distance before the first element is combined), and bounds a sender in every
 * part of the model: a sender cannot spend its whole allowance on a few coordinates.
 */
#include <errno.h>
#include <stdlib.h>

#include "compute.h"
#include "error.h"
#include "contribution.h"

#define TILE P2P_ROBUST_TILE

/* The first element of the chunk after the one holding element e (c has a chunk mask). */
static uint64_t chunk_end(const p2p_contribution *c, uint64_t e) {
    uint64_t k = (c->first_byte + byte_of(c->dtype, e)) / c->chunk_size;
    return first_at(c->dtype, (k + 1) * c->chunk_size - c->first_byte);  /* (the next chunk's first byte) */
}

/* Four doubles, as one AVX2 register (two SSE2 ones in the default build): the norms' eight partial
 * sums written out as two of them, since the compiler does not vectorise them from plain loops.
 * Vectors move through memcpy and pointers only (one passed by value would change the ABI). */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u32 __attribute__((vector_size(16)));
typedef int32_t v4i32 __attribute__((vector_size(16)));
typedef int64_t v4i64 __attribute__((vector_size(32)));  /* a comparison of two v4d: -1 where true */

/* A row's squared norm from its eight partial sums (lo: elements 0-3 of each group of eight, hi:
 * 4-7) and its tail's: partial sums, so that the adds do not wait on each other (one running sum in
 * strict IEEE order is bound by the add's latency), added in a fixed order. */
static inline double total(const v4d *lo, const v4d *hi, double rest) {
    return (((*lo)[0] + (*lo)[1]) + ((*lo)[2] + (*lo)[3])) + (((*hi)[0] + (*hi)[1]) + ((*hi)[2] + (*hi)[3])) + rest;
}

/* acc[0 .. 8) += x, y (eight differences), and their squares to the norm's partial sums lo, hi. */
static inline void add_eight(double *acc, const v4d *x, const v4d *y, v4d *lo, v4d *hi) {
    v4d p, q;
    *lo += *x * *x;
    *hi += *y * *y;
    memcpy(&p, acc, sizeof p);
    memcpy(&q, acc + 4, sizeof q);
    p += *x;
    q += *y;
    memcpy(acc, &p, sizeof p);
    memcpy(acc + 4, &q, sizeof q);
}

/* acc[i] += v[i] - o[i] over len float32 values; returns the differences' squared norm. It is finite
 * exactly when every difference is (a difference of two floats squares far below DBL_MAX). */
VECTOR_CLONES static double accumulate_f32(const float *restrict v, const double *restrict o, uint64_t len,
                                           double *restrict acc) {
    v4d lo = {0}, hi = {0}, x, y, p, q;
    v4f a, b;
    double rest = 0.0;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&a, v + i, sizeof a);
        memcpy(&b, v + i + 4, sizeof b);
        memcpy(&p, o + i, sizeof p);
        memcpy(&q, o + i + 4, sizeof q);
        x = __builtin_convertvector(a, v4d) - p;
        y = __builtin_convertvector(b, v4d) - q;
        add_eight(acc + i, &x, &y, &lo, &hi);
    }
    for (; i < len; i++) {
        double d = (double)v[i] - o[i];
        acc[i] += d;
        rest += d * d;
    }
    return total(&lo, &hi, rest);
}

/* Four int8 codes as doubles, sign-extended from one 32-bit word by shifts: the compiler converts
 * four bytes one at a time, and these shifts are one instruction each. */
static inline void i8x4(const int8_t *p, v4d *out) {
    uint32_t word = (uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8 | (uint32_t)(uint8_t)p[2] << 16 |
                    (uint32_t)(uint8_t)p[3] << 24;
    v4u32 w = {word, word, word, word};
    w <<= (v4u32){24, 16, 8, 0};
    *out = __builtin_convertvector((v4i32)w >> 24, v4d);
}

/* acc[i] += v[i] x scale - o[i] over len int8 codes of one scale block, whose values are finite (its
 * scale checked); returns the differences' squared norm: clipping's one pass, no row kept. */
VECTOR_CLONES static double accumulate_i8(const int8_t *restrict v, double scale, const double *restrict o,
                                          uint64_t len, double *restrict acc) {
    v4d lo = {0}, hi = {0}, x, y, p, q;
    double rest = 0.0;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        i8x4(v + i, &x);
        i8x4(v + i + 4, &y);
        memcpy(&p, o + i, sizeof p);
        memcpy(&q, o + i + 4, sizeof q);
        x = x * scale - p;
        y = y * scale - q;
        add_eight(acc + i, &x, &y, &lo, &hi);
    }
    for (; i < len; i++) {
        double d = (double)v[i] * scale - o[i];
        acc[i] += d;
        rest += d * d;
    }
    return total(&lo, &hi, rest);
}

/* d[i] -= o[i] over len elements; returns d's squared norm. */
VECTOR_CLONES static double subtract_row(double *restrict d, const double *restrict o, uint64_t len) {
    v4d lo = {0}, hi = {0}, x, y, p, q;
    double rest = 0.0;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&x, d + i, sizeof x);
        memcpy(&y, d + i + 4, sizeof y);
        memcpy(&p, o + i, sizeof p);
        memcpy(&q, o + i + 4, sizeof q);
        x -= p;
        y -= q;
        memcpy(d + i, &x, sizeof x);
        memcpy(d + i + 4, &y, sizeof y);
        lo += x * x;
        hi += y * y;
    }
    for (; i < len; i++) {
        d[i] -= o[i];
        rest += d[i] * d[i];
    }
    return total(&lo, &hi, rest);
}

VECTOR_CLONES static void add_row(double *restrict acc, const double *restrict d, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) acc[i] += d[i];
}

VECTOR_CLONES static void add_ones(double *restrict cnt, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) cnt[i] += 1.0;
}

/* v[i] = o[i] + acc[i] / (whole + cnt[i]) over len elements, written as float32: the merged tile. */
VECTOR_CLONES static void write_f32(float *restrict v, const double *restrict o, const double *restrict acc,
                                    double whole, const double *restrict cnt, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) v[i] = (float)(o[i] + acc[i] / (whole + cnt[i]));
}

/* Elements [from, to) of c into d - o (d, o: from the tile's first element, start), through the
 * plain merge's vectorised readers; returns their squared norm. */
static double read_run(const p2p_contribution *c, const double *o, uint64_t start, uint64_t from, uint64_t to,
                       double *d) {
    uint64_t i = from - start, len = to - from;
    memset(d + i, 0, (size_t)len * sizeof *d);
    if (c->dtype == P2P_F32) return accumulate_f32((const float *)c->values + from, o + i, len, d + i);
    add_values(d + i, c, from, len);
    return subtract_row(d + i, o + i, len);
}

/* Row of c's tile [start, end): d[i] = value - o[i] where element start + i arrived and is not
 * refused, 0 elsewhere, and ok[i] = 1 there, 0 elsewhere (ok: or NULL); with acc (clipping), acc += d
 * instead, and d is left undefined where a run went straight into acc. Returns how many arrived and
 * counted, adds the refused, and sets *d2 to d's squared norm. When not all counted, cnt[i] += 1
 * where one did (a row that counts whole is counted once for the tile, by the caller). */
static uint64_t read_tile(const p2p_contribution *c, const double *o, uint64_t start, uint64_t end, double *d,
                          double *ok, double *acc, double *cnt, uint64_t *refused, double *d2) {
    uint64_t got = 0;
    double norm2 = 0.0;
    int partial = 0;  /* whether cnt has this row's counts: from its first element that does not count */
    for (uint64_t e = start; e < end;) {
        uint64_t run_end = end, i = e - start, len;
        int usable = 1;
        if (c->chunk_arrived) {
            uint64_t ce = chunk_end(c, e);
            if (ce < run_end) run_end = ce;
            usable = c->chunk_arrived[(c->first_byte + byte_of(c->dtype, e)) / c->chunk_size] != 0;
        }
        int fits = 1;
        if ((c->dtype == P2P_I8 || c->dtype == P2P_I4) && c->finite_only) {  /* a run within one scale block */
            uint64_t block_end = (e / c->block + 1) * c->block;
            if (block_end < run_end) run_end = block_end;
            fits = scale_fits(c, e / c->block);
        }
        len = run_end - e;
        if (usable && fits && !c->element_arrived) {  /* the common case: the run whole, unless a value is not finite */
            double n2;
            int into_acc = 1;  /* whether the run goes straight into acc: clipping, values known finite */
            if (acc && c->dtype == P2P_I8 && c->finite_only)  /* one scale block, its scale checked */
                n2 = accumulate_i8((const int8_t *)c->values + e, c->scales[e / c->block], o + i, len, acc + i);
            else if (acc && c->dtype == P2P_F32 && (!c->finite_only || all_finite(c, e, run_end)))
                n2 = accumulate_f32((const float *)c->values + e, o + i, len, acc + i);
            else
                into_acc = 0, n2 = read_run(c, o, start, e, run_end, d);
            if (into_acc || isfinite(n2) || !c->finite_only) {
                if (acc && !into_acc) add_row(acc + i, d + i, len);
                if (partial) add_ones(cnt + i, len);
                for (uint64_t x = i; ok && x < i + len; x++) ok[x] = 1.0;
                norm2 += n2;
                got += len;
                e = run_end;
                continue;
            }
        }
        for (uint64_t x = e; x < run_end; x++) {
            i = x - start;
            d[i] = 0.0;
            if (ok) ok[i] = 0.0;
            double value = NAN;
            int arrived = usable && (!c->element_arrived || c->element_arrived[x]);
            if (arrived && fits) value = load(c->values, c->dtype, c->scales, c->block, x);
            if (arrived && c->finite_only && !isfinite(value)) (*refused)++;
            if (!arrived || (c->finite_only && !isfinite(value))) {
                if (!partial) add_ones(cnt, i);  /* every element before this one counted */
                partial = 1;
                continue;
            }
            d[i] = value - o[i];
            if (ok) ok[i] = 1.0;
            if (acc) acc[i] += d[i];
            if (partial) cnt[i] += 1.0;
            norm2 += d[i] * d[i];
            got++;
        }
        e = run_end;
    }
    *d2 = norm2;
    return got;
}

static void sort_doubles(double *a, uint32_t m) {
    for (uint32_t i = 1; i < m; i++) {
        double x = a[i];
        uint32_t j = i;
        for (; j > 0 && a[j - 1] > x; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* The median of tile t's history (entries >= 0) and `now` (when >= 0); -1 when there is none. */
static double tile_radius_base(const p2p_robust *how, uint64_t tiles, uint64_t t, double now, double *work) {
    uint32_t m = 0;
    for (uint32_t h = 0; how->history && h < how->nhistory; h++) {
        double x = how->history[h * tiles + t];
        if (x >= 0.0) work[m++] = x;
    }
    if (now >= 0.0) work[m++] = now;
    if (!m) return -1.0;
    sort_doubles(work, m);
    return work[(m - 1) / 2];
}

/* Clip tile [start, end) (tile t) of the k contributions, whose rows read_tile has summed into acc
 * unclipped (m, d2: their counts and squared norms): takes back from acc what each clipped row's
 * scale cuts, reading that row again into `row` (junk: TILE doubles for the second read's counts).
 * Returns the tile's median RMS distance (-1: nothing arrived). */
static double clip_tile(const p2p_robust *how, uint64_t tiles, uint64_t t, uint64_t start, uint64_t end,
                        const p2p_contribution *contribs, uint32_t k, const double *o, const uint64_t *m,
                        const double *d2, double *acc, double *row, double *junk, p2p_robust_sender *out,
                        double *work) {
    double *rms = work;  /* work: k + nhistory + 1 entries */
    uint32_t seen = 0;
    for (uint32_t j = 0; j < k; j++)
        if (m[j]) rms[seen++] = sqrt(d2[j] / (double)m[j]);
    double now = -1.0;
    if (seen) {
        sort_doubles(rms, seen);
        now = rms[(seen - 1) / 2];  /* the lower median: with two senders, the closer one */
    }
    double base = tile_radius_base(how, tiles, t, now, work + k);
    for (uint32_t j = 0; j < k; j++) {
        double typical = base * sqrt((double)m[j]), tau = how->multiplier * typical;
        double scale = 1.0;
        if (m[j] && d2[j] > tau * tau) scale = fmin(tau, typical) / sqrt(d2[j]);
        if (scale < 1.0) {  /* rare for an honest sender: read its row again rather than keep every row */
            uint64_t refused = 0;
            double norm2;
            read_tile(&contribs[j], o, start, end, row, NULL, NULL, junk, &refused, &norm2);
            for (uint64_t i = 0; i < end - start; i++) acc[i] -= (1.0 - scale) * row[i];
        }
        if (out) {
            out[j].kept2 += scale * scale * d2[j];
            if (scale < 1.0) out[j].clipped += m[j];
        }
    }
    return now;
}

/* a[i], b[i] = the smaller and the larger of the two: one compare-exchange of two rows, written
 * with masks (the compiler makes the plain loop a masked store). */
VECTOR_CLONES static void order_rows(double *restrict a, double *restrict b, uint64_t len) {
    uint64_t i = 0;
    for (; i + 4 <= len; i += 4) {
        v4d x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        v4i64 less = x < y, lo = ((v4i64)x & less) | ((v4i64)y & ~less), hi = ((v4i64)y & less) | ((v4i64)x & ~less);
        memcpy(a + i, &lo, sizeof lo);
        memcpy(b + i, &hi, sizeof hi);
    }
    for (; i < len; i++) {
        double x = a[i], y = b[i];
        a[i] = x < y ? x : y;
        b[i] = x < y ? y : x;
    }
}

/* The tile's k + 1 rows into sorted (the receiver's own, 0, and the senders'), sorted element-wise
 * by odd-even transposition, each compare-exchange one vectorised pass over two rows. With ok, a
 * value that did not arrive is +inf: it sorts after every value that did. */
static void sort_rows(uint64_t len, uint32_t k, const double *d, const double *ok, double *sorted) {
    uint32_t n = k + 1;
    memset(sorted, 0, (size_t)len * sizeof *sorted);
    for (uint32_t j = 0; j < k; j++) {
        double *row = sorted + (uint64_t)(j + 1) * TILE;
        const double *dj = d + (uint64_t)j * TILE;
        if (!ok) {
            memcpy(row, dj, (size_t)len * sizeof *d);
            continue;
        }
        const double *okj = ok + (uint64_t)j * TILE;
        for (uint64_t i = 0; i < len; i++) row[i] = okj[i] != 0.0 ? dj[i] : INFINITY;
    }
    for (uint32_t pass = 0; pass < n; pass++)
        for (uint32_t r = pass & 1; r + 1 < n; r += 2)
            order_rows(sorted + (uint64_t)r * TILE, sorted + (uint64_t)(r + 1) * TILE, len);
}

/* The trimmed mean of a tile that every sender brought whole, into acc (the sum of the values kept,
 * as differences from own): the sorted rows between the cuts added. Returns how many values each
 * element keeps; *lo and *hi: the rows at the cuts, the smallest and largest kept. */
static uint32_t trim_whole_tile(uint32_t trim, uint64_t len, uint32_t k, const double *d, double *sorted,
                                double *acc, const double **lo, const double **hi) {
    uint32_t n = k + 1, cut = trim < (n - 1) / 2 ? trim : (n - 1) / 2;
    sort_rows(len, k, d, NULL, sorted);
    memset(acc, 0, (size_t)len * sizeof *acc);
    for (uint32_t r = cut; r < n - cut; r++) add_row(acc, sorted + (uint64_t)r * TILE, len);
    *lo = sorted + (uint64_t)cut * TILE;
    *hi = sorted + (uint64_t)(n - 1 - cut) * TILE;
    return n - 2 * cut;
}

/* Row r of a sorted tile into the sums of the elements whose kept rows, [first, last], hold it, and
 * into lo or hi where it is the first or the last kept: selects by masks, never adding the +inf of a
 * value that did not arrive. */
VECTOR_CLONES static void keep_row(const double *restrict row, double r, const double *restrict first,
                                   const double *restrict last, double *restrict acc, double *restrict lo,
                                   double *restrict hi, uint64_t len) {
    v4d rr = {r, r, r, r};
    uint64_t i = 0;
    for (; i + 4 <= len; i += 4) {
        v4d v, f, l, a, x, y;
        memcpy(&v, row + i, sizeof v);
        memcpy(&f, first + i, sizeof f);
        memcpy(&l, last + i, sizeof l);
        memcpy(&a, acc + i, sizeof a);
        memcpy(&x, lo + i, sizeof x);
        memcpy(&y, hi + i, sizeof y);
        v4i64 kept = (rr >= f) & (rr <= l), at_first = rr == f, at_last = rr == l;
        a += (v4d)((v4i64)v & kept);
        x = (v4d)(((v4i64)v & at_first) | ((v4i64)x & ~at_first));
        y = (v4d)(((v4i64)v & at_last) | ((v4i64)y & ~at_last));
        memcpy(acc + i, &a, sizeof a);
        memcpy(lo + i, &x, sizeof x);
        memcpy(hi + i, &y, sizeof y);
    }
    for (; i < len; i++) {
        if (r >= first[i] && r <= last[i]) acc[i] += row[i];
        if (r == first[i]) lo[i] = row[i];
        if (r == last[i]) hi[i] = row[i];
    }
}

/* The trimmed mean of a tile where some sender missed elements: its rows sorted together as for a
 * whole tile, the missing values last, then each element cut by its own count m = whole + cnt[i]
 * (its own value and those that arrived, as read_tile counted them): rows [c, m - 1 - c] kept,
 * c = min(trim, (m - 1) / 2). Into acc (as trim_whole_tile), cnt (each element's count kept), lo and
 * hi (the smallest and largest kept); sorted: k + 3 rows of room (the sort, then each element's first
 * and last kept row). */
static void trim_partial_tile(uint32_t trim, uint64_t len, uint32_t k, const double *d, const double *ok,
                              double whole, double *sorted, double *acc, double *cnt, double *lo, double *hi) {
    uint32_t n = k + 1;
    double *first = sorted + (uint64_t)n * TILE, *last = first + TILE;
    sort_rows(len, k, d, ok, sorted);
    for (uint64_t i = 0; i < len; i++) {
        double m = whole + cnt[i], cut = fmin((double)trim, floor((m - 1.0) * 0.5));
        first[i] = cut;
        last[i] = m - 1.0 - cut;
        cnt[i] = m - 2.0 * cut;
    }
    memset(acc, 0, (size_t)len * sizeof *acc);
    for (uint32_t r = 0; r < n; r++) keep_row(sorted + (uint64_t)r * TILE, (double)r, first, last, acc, lo, hi, len);
}

/* One sender's values in a trimmed tile (ok: 1 where each arrived, its value 0 elsewhere) trimmed,
 * outside [lo, hi], or kept (ties at an end: kept, a bound no wider), with their squared sizes:
 * four lanes of sums, vectorised. */
VECTOR_CLONES static void count_trimmed(const double *restrict x, const double *restrict ok,
                                        const double *restrict lo, const double *restrict hi, uint64_t len,
                                        p2p_robust_sender *out) {
    v4d distance2 = {0}, kept2 = {0};
    v4i64 trimmed = {0};
    uint64_t i = 0;
    for (; i + 4 <= len; i += 4) {
        v4d v, a, l, h;
        memcpy(&v, x + i, sizeof v);
        memcpy(&a, ok + i, sizeof a);
        memcpy(&l, lo + i, sizeof l);
        memcpy(&h, hi + i, sizeof h);
        v4i64 cut = ((v < l) | (v > h)) & (a != (v4d){0});
        distance2 += v * v;  /* 0 where nothing arrived */
        kept2 += (v4d)((v4i64)(v * v) & ~cut);
        trimmed -= cut;
    }
    double d2 = (distance2[0] + distance2[1]) + (distance2[2] + distance2[3]);
    double k2 = (kept2[0] + kept2[1]) + (kept2[2] + kept2[3]);
    uint64_t n = (uint64_t)(trimmed[0] + trimmed[1] + trimmed[2] + trimmed[3]);
    for (; i < len; i++) {
        if (ok[i] == 0.0) continue;
        d2 += x[i] * x[i];
        if (x[i] < lo[i] || x[i] > hi[i]) n++;
        else k2 += x[i] * x[i];
    }
    out->distance2 += d2;
    out->kept2 += k2;
    out->clipped += n;
}

int p2p_robust_merge(void *own, int own_dtype, uint64_t n, const p2p_contribution *contribs, uint32_t k,
                     const p2p_robust *how, p2p_robust_sender *out) {
    if (own_dtype < P2P_F32 || own_dtype > P2P_BF16)
        return set_error(EINVAL, "robust merge: a tensor of dtype %d cannot be merged into", own_dtype);
    if (!how || (how->mode != P2P_ROBUST_CLIP && how->mode != P2P_ROBUST_TRIMMED))
        return set_error(EINVAL, "robust merge: no mode (P2P_ROBUST_CLIP or P2P_ROBUST_TRIMMED)");
    if (how->mode == P2P_ROBUST_CLIP && !(how->multiplier > 0.0 && isfinite(how->multiplier)))
        return set_error(EINVAL, "robust merge: the clipping multiplier must be finite and > 0");
    if (n && !own) return set_error(EINVAL, "robust merge: no tensor");
    if (k && !contribs) return set_error(EINVAL, "robust merge: no contributions");
    for (uint32_t i = 0; i < k; i++) {
        int rc = contribution_check(&contribs[i], n, i, "robust merge");
        if (rc) return rc;
    }
    if (out) memset(out, 0, (size_t)k * sizeof *out);
    uint64_t tiles = n / TILE + (n % TILE != 0);
    if (!k || !n) {
        for (uint64_t t = 0; how->tile_median_out && t < tiles; t++) how->tile_median_out[t] = -1.0;
        return 0;
    }
    /* trimmed: per sender a row of differences and one of arrivals, k + 1 rows to sort, two of kept
     * rows (trim_partial_tile) and the kept values' ends; clip: one row of differences and one of junk
     * counts (clip_tile); then a sorting row, and per sender its count and norm */
    int trimmed = how->mode == P2P_ROBUST_TRIMMED;
    size_t rows = (trimmed ? (size_t)3 * k + 5 : 2) * TILE, work = (size_t)2 * k + how->nhistory + 2;
    double *scratch = malloc((rows + work + 2 * TILE) * sizeof(double));
    uint64_t *m = malloc((size_t)k * sizeof *m);
    double *d2 = malloc((size_t)k * sizeof *d2);
    if (!scratch || !m || !d2) {
        free(scratch);
        free(m);
        free(d2);
        return set_error(ENOMEM, "robust merge: no memory for %u senders' tiles", k);
    }
    double *d = scratch, *ok = trimmed ? scratch + (size_t)k * TILE : NULL, *spare = scratch + rows;
    double *sorted = trimmed ? scratch + (size_t)2 * k * TILE : NULL;
    double *acc = spare + work, *cnt = acc + TILE, o[TILE];
    for (uint64_t t = 0; t < tiles; t++) {
        uint64_t start = t * TILE, end = n - start < TILE ? n : start + TILE, len = end - start;
        if (own_dtype == P2P_F32)
            load_f32(o, (const float *)own + start, len);
        else
            for (uint64_t i = 0; i < len; i++) o[i] = load(own, own_dtype, NULL, 0, start + i);
        memset(acc, 0, (size_t)len * sizeof *acc);
        memset(cnt, 0, (size_t)len * sizeof *cnt);
        double whole = 1.0;  /* the own value and every row that counted whole (the others: in cnt) */
        for (uint32_t j = 0; j < k; j++) {
            uint64_t refused = 0;
            double *row = trimmed ? d + (uint64_t)j * TILE : d, *row_ok = trimmed ? ok + (uint64_t)j * TILE : NULL;
            /* clipping adds each row unclipped: clip_tile takes back what it cuts */
            m[j] = read_tile(&contribs[j], o, start, end, row, row_ok, trimmed ? NULL : acc, cnt, &refused, &d2[j]);
            if (m[j] == len) whole += 1.0;
            if (out) {
                out[j].arrived += m[j];
                out[j].refused += refused;
                out[j].distance2 += trimmed ? 0.0 : d2[j];
            }
        }
        if (!trimmed) {
            double median = clip_tile(how, tiles, t, start, end, contribs, k, o, m, d2, acc, d, d + TILE, out, spare);
            if (how->tile_median_out) how->tile_median_out[t] = median;
        } else if (whole == k + 1) {  /* every sender brought the whole tile: sorted row by row */
            const double *lo, *hi;
            whole = trim_whole_tile(how->trim, len, k, d, sorted, acc, &lo, &hi);
            for (uint32_t j = 0; out && j < k; j++)
                count_trimmed(d + (uint64_t)j * TILE, ok + (uint64_t)j * TILE, lo, hi, len, &out[j]);
        } else {
            double *lo = sorted + (uint64_t)(k + 3) * TILE, *hi = lo + TILE;
            trim_partial_tile(how->trim, len, k, d, ok, whole, sorted, acc, cnt, lo, hi);
            whole = 0.0;  /* cnt: each element's count */
            for (uint32_t j = 0; out && j < k; j++)
                count_trimmed(d + (uint64_t)j * TILE, ok + (uint64_t)j * TILE, lo, hi, len, &out[j]);
        }
        if (own_dtype == P2P_F32) {
            write_f32((float *)own + start, o, acc, whole, cnt, len);
        } else {
            for (uint64_t i = 0; i < len; i++) store(own, own_dtype, start + i, o[i] + acc[i] / (whole + cnt[i]));
        }
    }
    free(scratch);
    free(m);
    free(d2);
    return 0;
}
