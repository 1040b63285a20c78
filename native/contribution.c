/* The one check of a contribution's lengths, and reading its values in vectorised loops (contribution.h). */
#include <errno.h>

#include "compute.h"
#include "contribution.h"
#include "error.h"

int contribution_check(const p2p_contribution *c, uint64_t n, uint32_t i, const char *what) {
    if (c->dtype < P2P_F32 || c->dtype > P2P_I4)
        return set_error(EINVAL, "%s: contribution %u has unknown dtype %d", what, i, c->dtype);
    if (n && !c->values) return set_error(EINVAL, "%s: contribution %u has no values", what, i);
    if (c->values_bytes < value_bytes(c->dtype, n))
        return set_error(EINVAL, "%s: contribution %u has %llu bytes of values, %llu elements need %llu", what, i,
                         (unsigned long long)c->values_bytes, (unsigned long long)n,
                         (unsigned long long)value_bytes(c->dtype, n));
    if (c->dtype == P2P_I8 || c->dtype == P2P_I4) {
        if (!c->scales || !c->block) return set_error(EINVAL, "%s: contribution %u has no scales", what, i);
        uint64_t blocks = n / c->block + (n % c->block != 0);
        if (c->nscales < blocks)
            return set_error(EINVAL, "%s: contribution %u has %llu scales, %llu elements need %llu", what, i,
                             (unsigned long long)c->nscales, (unsigned long long)n, (unsigned long long)blocks);
    }
    if (!c->chunk_arrived || !n) return 0;
    if (!c->chunk_size) return set_error(EINVAL, "%s: contribution %u has chunk_size 0", what, i);
    uint64_t last_byte = c->first_byte + value_bytes(c->dtype, n) - 1;
    if (last_byte < c->first_byte || last_byte / c->chunk_size >= c->nchunks)
        return set_error(EINVAL, "%s: contribution %u reaches past its %llu chunks", what, i,
                         (unsigned long long)c->nchunks);
    return 0;
}

/* sum[i] += scale * code of element from + i, for i < len, all in one scale block (int8, int4). */
VECTOR_CLONES static void add_i8(double *restrict sum, const int8_t *restrict v, double scale, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) sum[i] += (double)v[i] * scale;
}

VECTOR_CLONES static void add_i4(double *restrict sum, const uint8_t *restrict v, uint64_t from, double scale,
                                 uint64_t len) {
    uint64_t i = 0;
    if (from & 1 && len) {  /* a run that starts on a byte's high code */
        sum[0] += (double)((v[from / 2] >> 4) - 8) * scale;
        i = 1;
    }
    const uint8_t *restrict pairs = v + (from + i) / 2;
    uint64_t npairs = (len - i) / 2;
    for (uint64_t j = 0; j < npairs; j++) {
        sum[i + 2 * j] += (double)((pairs[j] & 0x0f) - 8) * scale;
        sum[i + 2 * j + 1] += (double)((pairs[j] >> 4) - 8) * scale;
    }
    if ((len - i) & 1) sum[len - 1] += (double)((pairs[npairs] & 0x0f) - 8) * scale;
}

VECTOR_CLONES void add_values(double *restrict sum, const p2p_contribution *c, uint64_t from, uint64_t len) {
    switch (c->dtype) {
    case P2P_F32: {
        const float *restrict v = (const float *)c->values + from;
        for (uint64_t i = 0; i < len; i++) sum[i] += v[i];
        break;
    }
    case P2P_F64: {
        const double *restrict v = (const double *)c->values + from;
        for (uint64_t i = 0; i < len; i++) sum[i] += v[i];
        break;
    }
    case P2P_F16: {
        const uint16_t *restrict v = (const uint16_t *)c->values + from;
        for (uint64_t i = 0; i < len; i++) sum[i] += f16_to_float(v[i]);
        break;
    }
    case P2P_BF16: {
        const uint16_t *restrict v = (const uint16_t *)c->values + from;
        for (uint64_t i = 0; i < len; i++) sum[i] += bf16_to_float(v[i]);
        break;
    }
    default:  /* P2P_I8, P2P_I4: (double)code * scale, as load() reads them */
        for (uint64_t e = from; e < from + len;) {
            uint64_t b = e / c->block, end = (b + 1) * c->block < from + len ? (b + 1) * c->block : from + len;
            if (c->dtype == P2P_I8)
                add_i8(sum + (e - from), (const int8_t *)c->values + e, c->scales[b], end - e);
            else
                add_i4(sum + (e - from), c->values, e, c->scales[b], end - e);
            e = end;
        }
    }
}

VECTOR_CLONES int all_finite(const p2p_contribution *c, uint64_t start, uint64_t end) {
    int bad = 0;
    if (c->dtype == P2P_F32) {
        const uint32_t *restrict v = (const uint32_t *)c->values;
        for (uint64_t i = start; i < end; i++) bad |= (v[i] & 0x7f800000u) == 0x7f800000u;
    } else if (c->dtype == P2P_F64) {
        const uint64_t *restrict v = (const uint64_t *)c->values;
        for (uint64_t i = start; i < end; i++) bad |= (v[i] & 0x7ff0000000000000u) == 0x7ff0000000000000u;
    } else {
        uint16_t exponent = c->dtype == P2P_F16 ? 0x7c00u : 0x7f80u;
        const uint16_t *restrict v = (const uint16_t *)c->values;
        for (uint64_t i = start; i < end; i++) bad |= (v[i] & exponent) == exponent;
    }
    return !bad;
}

VECTOR_CLONES void load_f32(double *restrict sum, const float *restrict v, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) sum[i] = v[i];
}
