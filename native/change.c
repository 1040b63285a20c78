/* The size of a model's change: the sum of squares of (now - before) over one tensor, in one pass
 * that reads both and writes nothing (no temporary the size of the tensor, no float64 copy).
 *
 * Differences are taken in double (exact for every dtype a tensor has here) and their squares
 * summed in eight double lanes, which the compiler vectorises; the lanes are added at the end. */
#include <errno.h>

#include "compute.h"
#include "error.h"
#include "contribution.h"


#define LANES 8

VECTOR_CLONES static double sumsq_f32(const float *restrict a, const float *restrict b, uint64_t n) {
    double lanes[LANES] = {0};
    uint64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            double d = (double)a[i + j] - (double)b[i + j];
            lanes[j] += d * d;
        }
    for (; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        lanes[0] += d * d;
    }
    double total = 0.0;
    for (int j = 0; j < LANES; j++) total += lanes[j];
    return total;
}

static double element(const void *v, int dtype, uint64_t e) {
    switch (dtype) {
    case P2P_F64: return ((const double *)v)[e];
    case P2P_F16: return f16_to_float(((const uint16_t *)v)[e]);
    default: return bf16_to_float(((const uint16_t *)v)[e]);
    }
}

int p2p_change_sumsq(const void *now, const void *before, int dtype, uint64_t n, double *out) {
    if (dtype < P2P_F32 || dtype > P2P_BF16) return set_error(EINVAL, "change: tensors of dtype %d", dtype);
    if (!out || (n && (!now || !before))) return set_error(EINVAL, "change: no tensors");
    if (dtype == P2P_F32) {
        *out = sumsq_f32(now, before, n);
        return 0;
    }
    double total = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        double d = element(now, dtype, i) - element(before, dtype, i);
        total += d * d;
    }
    *out = total;
    return 0;
}
