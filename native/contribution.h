/* What the compute module's merges share (merge.c, robust.c, change.c): a contribution's geometry
 * (bytes per element, the chunk that holds one), reading and writing the formats that travel,
 * the finite_only checks, the one check of a contribution's lengths against the network's
 * numbers, and building hot loops for AVX2 too. Include compute.h first (it has no guard: cffi
 * reads it as the module's declarations). */
#ifndef P2P_CONTRIBUTION_H
#define P2P_CONTRIBUTION_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* A function marked so is built for AVX2 too, picked at load time where the CPU has it (ifunc): a
 * plain x86-64 build reads floats into doubles two at a time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* cond ? a : b, as a mask: both sides are computed (a ?: of float results lets the compiler move the
 * float operation into the branch, which -ftrapping-math then keeps from vectorising). */
static inline uint32_t pick(int cond, uint32_t a, uint32_t b) {
    uint32_t mask = 0u - (uint32_t)(cond != 0);
    return (a & mask) | (b & ~mask);
}

/* binary16 -> float, exactly (inf and a NaN's payload kept), without branches (loops vectorise). */
static inline float f16_to_float(uint16_t h) {
    uint32_t magnitude = h & 0x7fffu;
    uint32_t normal = (magnitude << 13) + (magnitude >= 0x7c00u ? 0x70000000u : 0x38000000u);  /* rebias */
    uint32_t subnormal = bits_of((float)magnitude * 5.9604644775390625e-8f);   /* units of 2^-24, exact */
    return float_of((uint32_t)(h & 0x8000u) << 16 | pick(magnitude < 0x400u, subnormal, normal));
}

static inline float bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Bytes per element; P2P_I4 packs two elements in a byte (see byte_of, first_at, value_bytes). */
static const uint32_t ITEM_SIZE[] = {[P2P_F32] = 4, [P2P_F64] = 8, [P2P_F16] = 2, [P2P_BF16] = 2, [P2P_I8] = 1};

/* The offset of the byte that holds element e. */
static inline uint64_t byte_of(int dtype, uint64_t e) {
    return dtype == P2P_I4 ? e / 2 : e * ITEM_SIZE[dtype];
}

/* The first element that starts at byte offset b or later. */
static inline uint64_t first_at(int dtype, uint64_t b) {
    return dtype == P2P_I4 ? 2 * b : (b + ITEM_SIZE[dtype] - 1) / ITEM_SIZE[dtype];
}

/* The bytes that n elements take. */
static inline uint64_t value_bytes(int dtype, uint64_t n) {
    return dtype == P2P_I4 ? n / 2 + (n & 1) : n * ITEM_SIZE[dtype];
}

/* float -> bfloat16, round to nearest even, NaN kept NaN (as torch does). */
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* float -> binary16, round to nearest even, overflow to inf. */
static inline uint16_t float_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0);  /* inf, NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;                                   /* rounds past 65504 */
    if (a < 0x38800000u) {                                                        /* subnormal or zero */
        float m = fabsf(f) * 16777216.0f;            /* units of 2^-24, exact in float */
        return sign | (uint16_t)nearbyintf(m);      /* the default rounding mode: to nearest even */
    }
    uint32_t rounded = a + 0xfff + ((a >> 13) & 1);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

/* Element e of values of dtype (scales and block for P2P_I8 and P2P_I4 only). */
static inline double load(const void *v, int dtype, const float *scales, uint32_t block, uint64_t e) {
    switch (dtype) {
    case P2P_F32: return ((const float *)v)[e];
    case P2P_F64: return ((const double *)v)[e];
    case P2P_F16: return f16_to_float(((const uint16_t *)v)[e]);
    case P2P_BF16: return bf16_to_float(((const uint16_t *)v)[e]);
    case P2P_I8: return (double)((const int8_t *)v)[e] * scales[e / block];
    default: {
        uint8_t pair = ((const uint8_t *)v)[e / 2];
        int code = (e & 1) ? pair >> 4 : pair & 0x0f;
        return (double)(code - 8) * scales[e / block];
    }
    }
}

static inline void store(void *v, int dtype, uint64_t e, double x) {
    switch (dtype) {
    case P2P_F32: ((float *)v)[e] = (float)x; break;
    case P2P_F64: ((double *)v)[e] = x; break;
    case P2P_F16: ((uint16_t *)v)[e] = float_to_f16((float)x); break;
    default: ((uint16_t *)v)[e] = float_to_bf16((float)x); break;
    }
}

/* Whether c's values are checked one by one: finite_only, and a dtype whose values can be NaN or
 * inf themselves (an int8 or int4 value is finite once its block's scale is checked). */
static inline int checks_values(const p2p_contribution *c) {
    return c->finite_only && c->dtype <= P2P_BF16;
}

/* Whether c's values come in blocks whose scales are checked. */
static inline int checks_scales(const p2p_contribution *c) {
    return c->finite_only && (c->dtype == P2P_I8 || c->dtype == P2P_I4);
}

/* Whether scale b of c reads every code as a finite float32: |scale| times the largest code a byte
 * can carry (-128 for int8, -8 for int4) at most FLT_MAX; false for NaN and inf. */
static inline int scale_fits(const p2p_contribution *c, uint64_t b) {
    return fabs((double)c->scales[b]) * (c->dtype == P2P_I8 ? 128.0 : 8.0) <= FLT_MAX;
}

/* 0 when c's arrays hold n elements and its chunks cover them, else EINVAL (p2p_last_error says
 * which of contribution i's numbers does not fit, prefixed by `what`): every length from the
 * network checked before a merge reads it. */
int contribution_check(const p2p_contribution *c, uint64_t n, uint32_t i, const char *what);

/* sum[i] += value of element from + i of c, for i < len (no checks: the caller made them). Each
 * dtype in a loop of its own, and int8/int4 one scale block at a time, so that the compiler
 * vectorises them (load()'s per-element dtype switch and block division would not). */
void add_values(double *restrict sum, const p2p_contribution *c, uint64_t from, uint64_t len);

/* Whether every value of c in [start, end) is finite (the float dtypes; integer ops, so they vectorise). */
int all_finite(const p2p_contribution *c, uint64_t start, uint64_t end);

/* sum[i] = v[i], float32 read into double. */
void load_f32(double *restrict sum, const float *restrict v, uint64_t len);

#endif
