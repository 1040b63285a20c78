/* Reading the values a contribution carries, element by element: the same readings as merge.c's
 * load() and finite_only checks (float32/64, binary16, bfloat16 bits, int8 and packed int4 times a
 * scale per block), for the merges that are not merge.c's (robust.c). Header-only, static inline:
 * merge.c keeps its own copies until its rewrite moves to this header. Include compute.h first (it
 * has no include guard). */
#ifndef P2P_VALUES_H
#define P2P_VALUES_H

#include <float.h>
#include <math.h>
#include <string.h>

static inline float values_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);           /* inf, NaN */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);   /* normal: rebias 15 -> 127 */
    } else {
        float f = ldexpf((float)mant, -24);                 /* subnormal (or zero) */
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float values_bf16(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Element e of values of dtype (scales and block for P2P_I8 and P2P_I4 only). */
static inline double values_load(const void *v, int dtype, const float *scales, uint32_t block, uint64_t e) {
    switch (dtype) {
    case P2P_F32: return ((const float *)v)[e];
    case P2P_F64: return ((const double *)v)[e];
    case P2P_F16: return values_f16(((const uint16_t *)v)[e]);
    case P2P_BF16: return values_bf16(((const uint16_t *)v)[e]);
    case P2P_I8: return (double)((const int8_t *)v)[e] * scales[e / block];
    default: {
        uint8_t pair = ((const uint8_t *)v)[e / 2];
        int code = (e & 1) ? pair >> 4 : pair & 0x0f;
        return (double)(code - 8) * scales[e / block];
    }
    }
}

/* float -> bfloat16, round to nearest even, NaN kept NaN (as torch does). */
static inline uint16_t values_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* float -> binary16, round to nearest even, overflow to inf. */
static inline uint16_t values_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0);  /* inf, NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;                                   /* rounds past 65504 */
    if (a < 0x38800000u) {                                                        /* subnormal or zero */
        float m = fabsf(f) * 16777216.0f;
        return sign | (uint16_t)nearbyintf(m);
    }
    uint32_t rounded = a + 0xfff + ((a >> 13) & 1);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

static inline void values_store(void *v, int dtype, uint64_t e, double x) {
    switch (dtype) {
    case P2P_F32: ((float *)v)[e] = (float)x; break;
    case P2P_F64: ((double *)v)[e] = x; break;
    case P2P_F16: ((uint16_t *)v)[e] = values_to_f16((float)x); break;
    default: ((uint16_t *)v)[e] = values_to_bf16((float)x); break;
    }
}

/* The offset of the byte that holds element e (P2P_I4: two elements a byte). */
static inline uint64_t values_byte_of(int dtype, uint64_t e) {
    static const uint32_t size[] = {[P2P_F32] = 4, [P2P_F64] = 8, [P2P_F16] = 2, [P2P_BF16] = 2, [P2P_I8] = 1};
    return dtype == P2P_I4 ? e / 2 : e * size[dtype];
}

/* Whether scale b of c reads every code as a finite float32 (finite_only's check). */
static inline int values_scale_fits(const p2p_contribution *c, uint64_t b) {
    return fabs((double)c->scales[b]) * (c->dtype == P2P_I8 ? 128.0 : 8.0) <= FLT_MAX;
}

#endif
