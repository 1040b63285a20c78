/* Robust merging: one tensor merged in place so that no one sender can drag it far (see compute.h).
 *
 * The tensor is walked in tiles of P2P_ROBUST_TILE elements. Each contribution's tile is read once
 * (values.h: the readings of merge.c) into a scratch row of differences from the receiver's own
 * values, 0 where it did not arrive or was refused, beside a row of 1/0 arrivals; the scratch
 * (16 KiB a sender) stays in cache while the tile is combined: clipping scales each row by its
 * sender's factor, the trimmed mean sorts each element's few values. One read of the contributions,
 * as the plain merge: the extra work is on cached rows.
 *
 * Clipping per tile rather than over the whole tensor keeps that one read (a whole-tensor radius
 * would need every distance before the first element is combined), and bounds a sender in every
 * part of the model: a sender cannot spend its whole allowance on a few coordinates.
 */
#include <errno.h>
#include <stdlib.h>

#include "compute.h"
#include "error.h"
#include "values.h"

#define TILE P2P_ROBUST_TILE

static int robust_check(const p2p_contribution *c, uint64_t n, uint32_t i) {
    if (c->dtype < P2P_F32 || c->dtype > P2P_I4)
        return set_error(EINVAL, "robust merge: contribution %u has unknown dtype %d", i, c->dtype);
    if (n && !c->values) return set_error(EINVAL, "robust merge: contribution %u has no values", i);
    uint64_t need = c->dtype == P2P_I4 ? n / 2 + (n & 1) : values_byte_of(c->dtype, n);
    if (c->values_bytes < need)
        return set_error(EINVAL, "robust merge: contribution %u has %llu bytes of values, %llu elements need %llu", i,
                         (unsigned long long)c->values_bytes, (unsigned long long)n, (unsigned long long)need);
    if (c->dtype == P2P_I8 || c->dtype == P2P_I4) {
        if (!c->scales || !c->block) return set_error(EINVAL, "robust merge: contribution %u has no scales", i);
        if (c->nscales < n / c->block + (n % c->block != 0))
            return set_error(EINVAL, "robust merge: contribution %u has %llu scales for %llu elements", i,
                             (unsigned long long)c->nscales, (unsigned long long)n);
    }
    if (!c->chunk_arrived || !n) return 0;
    if (!c->chunk_size) return set_error(EINVAL, "robust merge: contribution %u has chunk_size 0", i);
    uint64_t last_byte = c->first_byte + need - 1;
    if (last_byte < c->first_byte || last_byte / c->chunk_size >= c->nchunks)
        return set_error(EINVAL, "robust merge: contribution %u reaches past its %llu chunks", i,
                         (unsigned long long)c->nchunks);
    return 0;
}

/* The first element of the chunk after the one holding element e (c has a chunk mask). */
static uint64_t chunk_end(const p2p_contribution *c, uint64_t e) {
    uint64_t k = (c->first_byte + values_byte_of(c->dtype, e)) / c->chunk_size;
    uint64_t b = (k + 1) * c->chunk_size - c->first_byte;  /* first byte of the next chunk */
    if (c->dtype == P2P_I4) return 2 * b;
    uint64_t size = values_byte_of(c->dtype, 1);
    return (b + size - 1) / size;
}

/* Row of c's tile [start, end): d[i] = value - o[i] and ok[i] = 1 where element start + i arrived
 * and is not refused, 0 and 0 elsewhere; returns how many arrived and counted, adds the refused. */
static uint64_t read_tile(const p2p_contribution *c, const double *o, uint64_t start, uint64_t end,
                          double *d, double *ok, uint64_t *refused) {
    uint64_t len = end - start, got = 0;
    if (c->dtype == P2P_F32 && !c->chunk_arrived && !c->element_arrived && !c->finite_only) {
        const float *v = (const float *)c->values + start;  /* the common case, vectorised */
        for (uint64_t i = 0; i < len; i++) {
            d[i] = v[i] - o[i];
            ok[i] = 1.0;
        }
        return len;
    }
    for (uint64_t e = start; e < end;) {
        uint64_t run_end = end;
        int usable = 1;
        if (c->chunk_arrived) {
            uint64_t ce = chunk_end(c, e);
            if (ce < run_end) run_end = ce;
            usable = c->chunk_arrived[(c->first_byte + values_byte_of(c->dtype, e)) / c->chunk_size] != 0;
        }
        int scaled = c->dtype == P2P_I8 || c->dtype == P2P_I4;
        int fits = 1;
        if (scaled && c->finite_only) {  /* a run within one scale block */
            uint64_t block_end = (e / c->block + 1) * c->block;
            if (block_end < run_end) run_end = block_end;
            fits = values_scale_fits(c, e / c->block);
        }
        for (uint64_t x = e; x < run_end; x++) {
            uint64_t i = x - start;
            d[i] = 0.0;
            ok[i] = 0.0;
            if (!usable || (c->element_arrived && !c->element_arrived[x])) continue;
            double value = fits ? values_load(c->values, c->dtype, c->scales, c->block, x) : NAN;
            if (c->finite_only && !isfinite(value)) {
                (*refused)++;
                continue;
            }
            d[i] = value - o[i];
            ok[i] = 1.0;
            got++;
        }
        e = run_end;
    }
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

/* Clip tile [start, end) of k rows (d, ok) into acc and cnt; returns the tile's median RMS distance. */
static double clip_tile(const p2p_robust *how, uint64_t tiles, uint64_t t, uint64_t len, uint32_t k,
                        const double *d, const double *ok, const uint64_t *m, double *acc, double *cnt,
                        p2p_robust_sender *out, double *work) {
    double *rms = work, *d2 = work + k;  /* work: 2k + nhistory + 1 entries */
    uint32_t seen = 0;
    for (uint32_t j = 0; j < k; j++) {
        const double *row = d + (uint64_t)j * TILE;
        double s = 0.0;
        for (uint64_t i = 0; i < len; i++) s += row[i] * row[i];
        d2[j] = s;
        if (m[j]) rms[seen++] = sqrt(s / (double)m[j]);
    }
    double now = -1.0;
    if (seen) {
        sort_doubles(rms, seen);
        now = rms[(seen - 1) / 2];  /* the lower median: with two senders, the closer one */
    }
    double base = tile_radius_base(how, tiles, t, now, work + 2 * k);
    for (uint32_t j = 0; j < k; j++) {
        const double *row = d + (uint64_t)j * TILE, *arrived = ok + (uint64_t)j * TILE;
        double scale = 1.0, tau = how->multiplier * base * sqrt((double)m[j]);
        if (m[j] && d2[j] > tau * tau) scale = tau / sqrt(d2[j]);
        for (uint64_t i = 0; i < len; i++) {
            acc[i] += scale * row[i];
            cnt[i] += arrived[i];
        }
        if (out) {
            out[j].distance2 += d2[j];
            out[j].kept2 += scale * scale * d2[j];
            if (scale < 1.0) out[j].clipped += m[j];
        }
    }
    return now;
}

/* The trimmed mean of each element of the tile into acc (as a difference from own) and cnt = 1. */
static void trim_tile(uint32_t trim, uint64_t len, uint32_t k, const double *d, const double *ok, double *acc,
                      double *cnt, p2p_robust_sender *out, double *work) {
    for (uint64_t i = 0; i < len; i++) {
        uint32_t m = 1;
        work[0] = 0.0;  /* own, as a difference from itself */
        for (uint32_t j = 0; j < k; j++)
            if (ok[(uint64_t)j * TILE + i] != 0.0) work[m++] = d[(uint64_t)j * TILE + i];
        sort_doubles(work, m);
        uint32_t cut = trim < (m - 1) / 2 ? trim : (m - 1) / 2;
        double lo = work[cut], hi = work[m - 1 - cut], sum = 0.0;
        for (uint32_t x = cut; x < m - cut; x++) sum += work[x];
        acc[i] = sum;
        cnt[i] = (double)(m - 2 * cut);
        if (!out) continue;
        /* per sender: its value trimmed when outside [lo, hi] (ties at an end: kept, a bound no wider) */
        for (uint32_t j = 0; j < k; j++) {
            if (ok[(uint64_t)j * TILE + i] == 0.0) continue;
            double x = d[(uint64_t)j * TILE + i];
            out[j].distance2 += x * x;
            if (x < lo || x > hi) out[j].clipped++;
            else out[j].kept2 += x * x;
        }
    }
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
        int rc = robust_check(&contribs[i], n, i);
        if (rc) return rc;
    }
    if (out) memset(out, 0, (size_t)k * sizeof *out);
    uint64_t tiles = n / TILE + (n % TILE != 0);
    if (!k || !n) {
        for (uint64_t t = 0; how->tile_median_out && t < tiles; t++) how->tile_median_out[t] = -1.0;
        return 0;
    }
    /* per sender a row of differences and one of arrivals; a sorting row; per sender its count */
    size_t rows = (size_t)2 * k * TILE, work = (size_t)2 * k + how->nhistory + 2;
    double *scratch = malloc((rows + work + 2 * TILE) * sizeof(double));
    uint64_t *m = malloc((size_t)k * sizeof *m);
    if (!scratch || !m) {
        free(scratch);
        free(m);
        return set_error(ENOMEM, "robust merge: no memory for %u senders' tiles", k);
    }
    double *d = scratch, *ok = scratch + (size_t)k * TILE, *spare = scratch + rows;
    double *acc = spare + work, *cnt = acc + TILE, o[TILE];
    for (uint64_t t = 0; t < tiles; t++) {
        uint64_t start = t * TILE, end = n - start < TILE ? n : start + TILE, len = end - start;
        for (uint64_t i = 0; i < len; i++) o[i] = values_load(own, own_dtype, NULL, 0, start + i);
        for (uint32_t j = 0; j < k; j++) {
            uint64_t refused = 0;
            m[j] = read_tile(&contribs[j], o, start, end, d + (uint64_t)j * TILE, ok + (uint64_t)j * TILE, &refused);
            if (out) {
                out[j].arrived += m[j];
                out[j].refused += refused;
            }
        }
        if (how->mode == P2P_ROBUST_CLIP) {
            for (uint64_t i = 0; i < len; i++) {
                acc[i] = 0.0;
                cnt[i] = 1.0;
            }
            double median = clip_tile(how, tiles, t, len, k, d, ok, m, acc, cnt, out, spare);
            if (how->tile_median_out) how->tile_median_out[t] = median;
        } else {
            trim_tile(how->trim, len, k, d, ok, acc, cnt, out, spare);
        }
        if (own_dtype == P2P_F32) {
            float *v = (float *)own + start;
            for (uint64_t i = 0; i < len; i++) v[i] = (float)(o[i] + acc[i] / cnt[i]);
        } else {
            for (uint64_t i = 0; i < len; i++) values_store(own, own_dtype, start + i, o[i] + acc[i] / cnt[i]);
        }
    }
    free(scratch);
    free(m);
    return 0;
}
