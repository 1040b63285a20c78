/* Compression in one pass (p2p_quantize, compute.h): a piece's values read in their dtype, the error
 * feedback added, the codes (and int8/int4 scales) written, what a receiver reads of them written
 * where asked, and the residual updated, with no temporary the size of the piece.
 *
 * The piece is walked in chunks of CHUNK values (a whole number of blocks), so that the float32
 * values, their codes and their reads stay in L1 between the steps that each make one simple,
 * vectorisable loop over the chunk.
 *
 * Every result is bit for bit what `Compressor`'s numpy did before it (tests/sync/test_quantize.py
 * keeps that code as the reference), NaN and inf included, which fixes a few choices below:
 * - x + residual keeps a NaN x's own bits (quieted) whatever the residual holds, as numpy's
 *   x += residual does (x86 returns the first operand's NaN; the compiler may swap the operands);
 * - the fp16 codes of a NaN keep its sign and the top of its payload as numpy's cast does (not
 *   float_to_f16's one quiet NaN); fp16 is written branch-free here (f16_clipped; read by contribution.h's f16_to_float), in
 *   integers where it chooses, so that its loops vectorise;
 * - a block's scale is NaN when one of its values is (of the NaNs there, the one with the largest
 *   payload: numpy's pick depends on its SIMD lanes), and a code is float32 -> int32 -> its low byte
 *   as numpy's cast does (0 for NaN or past int32's range), which only matters where a block's
 *   scale underflows (a subnormal largest value) or is not finite;
 * - the residual is x - read in a loop of its own: the read is a rounded float32 product, never
 *   fused into the subtraction (-ffp-contract cannot reach across the two loops).
 */
#include <errno.h>

#include "compute.h"
#include "error.h"
#include "contribution.h"

#define CHUNK 4096        /* values per pass: 16 KiB of float32, and as much again of reads */
#define MAX_BLOCK 2048    /* values per scale at most: two blocks (an even count, for int4) fit a chunk */

/* float (bits u) clipped to +-65504 (0x477fe000; inf too) -> binary16 as numpy casts it, without
 * branches (so that the loop vectorises): rounded to nearest even (float_to_f16's way), and a NaN
 * keeping its sign and the top ten bits of its payload (one more where those are all zero, so that
 * it stays a NaN), where float_to_f16 makes every NaN 0x7e00. */
static inline uint16_t f16_clipped(uint32_t u) {
    uint32_t a = u & 0x7fffffffu;
    uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1)) >> 13;   /* rebias 127 -> 15, round */
    uint32_t subnormal = bits_of(float_of(a) + 0.5f) - 0x3f000000u;       /* below 2^-14: the add rounds at 2^-24 */
    uint32_t nan = 0x7c00u + ((a & 0x7fffffu) >> 13);
    nan += nan == 0x7c00u;
    uint32_t h = pick(a > 0x7f800000u, nan, pick(a > 0x477fe000u, 0x7bffu, pick(a >= 0x38800000u, normal, subnormal)));
    return (uint16_t)(((u >> 16) & 0x8000u) | h);
}

/* x[i] = element from + i of values (dtype P2P_F32, P2P_F64, P2P_F16 or P2P_BF16 bits) as float32. */
VECTOR_CLONES static void load_chunk(float *restrict x, const void *values, int dtype, uint64_t from, uint64_t len) {
    switch (dtype) {
    case P2P_F32: memcpy(x, (const float *)values + from, (size_t)len * sizeof *x); break;
    case P2P_F64: {
        const double *restrict v = (const double *)values + from;
        for (uint64_t i = 0; i < len; i++) x[i] = (float)v[i];
        break;
    }
    case P2P_F16: {
        const uint16_t *restrict v = (const uint16_t *)values + from;
        for (uint64_t i = 0; i < len; i++) x[i] = f16_to_float(v[i]);
        break;
    }
    default: {
        const uint16_t *restrict v = (const uint16_t *)values + from;
        for (uint64_t i = 0; i < len; i++) x[i] = bf16_to_float(v[i]);
    }
    }
}

/* x[i] -= anchor[i]: the change since the anchor, as numpy's float32 subtraction makes it. */
VECTOR_CLONES static void subtract_anchor(float *restrict x, const float *restrict anchor, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) x[i] -= anchor[i];
}

/* x[i] += residual[i]; a NaN x stays its own NaN, quieted, whichever operand the add takes first.
 * Branch-free, in integers where it chooses (the loop vectorises). */
VECTOR_CLONES static void add_residual(float *restrict x, const float *restrict residual, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) {
        uint32_t own = bits_of(x[i]), sum = bits_of(x[i] + residual[i]);
        x[i] = float_of(pick((own & 0x7fffffffu) > 0x7f800000u, own | 0x400000u, sum));
    }
}

/* residual[i] = x[i] - read[i]: what this round's codes did not carry, sent in the next. */
VECTOR_CLONES static void keep_residual(float *restrict residual, const float *restrict x, const float *restrict read,
                                        uint64_t len) {
    for (uint64_t i = 0; i < len; i++) residual[i] = x[i] - read[i];
}

/* fp16: values clipped to +-65504 (a NaN passes), rounded to nearest even; read[i] their value. */
VECTOR_CLONES static void encode_f16(uint16_t *restrict codes, float *restrict read, const float *restrict x,
                                     uint64_t len) {
    for (uint64_t i = 0; i < len; i++) codes[i] = f16_clipped(bits_of(x[i]));
    if (read)
        for (uint64_t i = 0; i < len; i++) read[i] = f16_to_float(codes[i]);
}

/* bf16: rounded to nearest even, a NaN as 0x7fc0 (bfloat16.store's rounding); read[i] their value. */
VECTOR_CLONES static void encode_bf16(uint16_t *restrict codes, float *restrict read, const float *restrict x,
                                      uint64_t len) {
    for (uint64_t i = 0; i < len; i++) codes[i] = float_to_bf16(x[i]);
    if (read)
        for (uint64_t i = 0; i < len; i++) read[i] = bf16_to_float(codes[i]);
}

/* The scale of a block of len values: max |x| / top, 1 where that is 0; a NaN value makes it NaN
 * (the largest |x| compared as bits: a NaN's exceed every number's). */
VECTOR_CLONES static float block_scale(const float *restrict x, uint64_t len, float top) {
    uint32_t largest = 0;
    for (uint64_t i = 0; i < len; i++) {
        uint32_t magnitude = bits_of(x[i]) & 0x7fffffffu;
        largest = magnitude > largest ? magnitude : largest;
    }
    float scale = float_of(largest) / top;
    return scale == 0.0f ? 1.0f : scale;
}

/* A rounded quotient as numpy casts float32 to int8: through int32 (0 for NaN and past its range),
 * then its low byte. */
static inline int8_t code_of(float y) {
    return (int8_t)(uint8_t)(uint32_t)(fabsf(y) < 2147483648.0f ? (int32_t)y : 0);
}

/* q[i] = x[i] / scale rounded to nearest even, as an int8; read[i] = q[i] x scale (NULL: not asked). */
VECTOR_CLONES static void block_codes(int8_t *restrict q, float *restrict read, const float *restrict x, uint64_t len,
                                      float scale) {
    for (uint64_t i = 0; i < len; i++) q[i] = code_of(rintf(x[i] / scale));
    if (read)
        for (uint64_t i = 0; i < len; i++) read[i] = (float)q[i] * scale;
}

/* int4: codes q + 8, element 2i in the low nibble of byte i and 2i + 1 in the high one (pack_int4's
 * layout, so that a code past -8..7 spills into the high nibble as it did there); an odd len pads
 * the last high nibble with 8. */
VECTOR_CLONES static void pack_pairs(uint8_t *restrict packed, const int8_t *restrict q, uint64_t len) {
    for (uint64_t i = 0; i < len / 2; i++)
        packed[i] = (uint8_t)((uint8_t)(q[2 * i] + 8) | (uint8_t)((uint8_t)(q[2 * i + 1] + 8) << 4));
    if (len & 1) packed[len / 2] = (uint8_t)((uint8_t)(q[len - 1] + 8) | 0x80);
}

/* 0 when every array of job is there and long enough for n values, else EINVAL. */
static int quantize_check(const p2p_quantize_job *job, uint64_t n) {
    if (!job) return set_error(EINVAL, "quantize: no job");
    if (job->dtype < P2P_F32 || job->dtype > P2P_BF16)
        return set_error(EINVAL, "quantize: values of dtype %d", job->dtype);
    if (job->format < P2P_F16 || job->format > P2P_I4) return set_error(EINVAL, "quantize: format %d", job->format);
    if (n && (!job->values || !job->codes)) return set_error(EINVAL, "quantize: no values or no codes");
    if (job->values_bytes < value_bytes(job->dtype, n))
        return set_error(EINVAL, "quantize: %llu bytes of values, %llu elements need %llu",
                         (unsigned long long)job->values_bytes, (unsigned long long)n,
                         (unsigned long long)value_bytes(job->dtype, n));
    if (job->codes_bytes < value_bytes(job->format, n))
        return set_error(EINVAL, "quantize: %llu bytes for codes, %llu elements need %llu",
                         (unsigned long long)job->codes_bytes, (unsigned long long)n,
                         (unsigned long long)value_bytes(job->format, n));
    if (job->anchor && (job->dtype != P2P_F32 || job->nanchor < n))
        return set_error(EINVAL, "quantize: an anchor of %llu float32 for %llu elements of dtype %d",
                         (unsigned long long)job->nanchor, (unsigned long long)n, job->dtype);
    if (job->residual && job->nresidual < n)
        return set_error(EINVAL, "quantize: %llu residuals for %llu elements", (unsigned long long)job->nresidual,
                         (unsigned long long)n);
    if (job->decoded && job->ndecoded < n)
        return set_error(EINVAL, "quantize: room for %llu decoded values, %llu elements",
                         (unsigned long long)job->ndecoded, (unsigned long long)n);
    if (job->format == P2P_I8 || job->format == P2P_I4) {
        if (job->block < 1 || job->block > MAX_BLOCK)
            return set_error(EINVAL, "quantize: blocks of %u values (1 to %d)", job->block, MAX_BLOCK);
        uint64_t blocks = n / job->block + (n % job->block != 0);
        if (!job->scales || job->nscales < blocks)
            return set_error(EINVAL, "quantize: %llu scales, %llu elements need %llu",
                             job->scales ? (unsigned long long)job->nscales : 0ULL, (unsigned long long)n,
                             (unsigned long long)blocks);
    }
    return 0;
}

/* The codes (and scales) of the chunk x of len values that starts at element start. */
static void encode_chunk(const p2p_quantize_job *job, const float *x, float *read, uint64_t start, uint64_t len) {
    if (job->format == P2P_F16) {
        encode_f16((uint16_t *)job->codes + start, read, x, len);
        return;
    }
    if (job->format == P2P_BF16) {
        encode_bf16((uint16_t *)job->codes + start, read, x, len);
        return;
    }
    int8_t q[CHUNK];
    int8_t *codes = job->format == P2P_I8 ? (int8_t *)job->codes + start : q;
    float top = job->format == P2P_I8 ? 127.0f : 7.0f;
    for (uint64_t b = 0; b < len; b += job->block) {
        uint64_t blen = len - b < job->block ? len - b : job->block;
        float scale = block_scale(x + b, blen, top);
        job->scales[(start + b) / job->block] = scale;
        block_codes(codes + b, read ? read + b : NULL, x + b, blen, scale);
    }
    if (job->format == P2P_I4) pack_pairs((uint8_t *)job->codes + start / 2, q, len);
}

int p2p_quantize(const p2p_quantize_job *job, uint64_t n) {
    int rc = quantize_check(job, n);
    if (rc) return rc;
    /* a whole number of blocks, an even number of values per chunk: no block and no int4 byte straddles two */
    uint64_t chunk = job->format >= P2P_I8 ? 2 * job->block * (CHUNK / (2 * job->block)) : CHUNK;
    float x[CHUNK], reads[CHUNK];
    for (uint64_t start = 0; start < n; start += chunk) {
        uint64_t len = n - start < chunk ? n - start : chunk;
        load_chunk(x, job->values, job->dtype, start, len);
        if (job->anchor) subtract_anchor(x, job->anchor + start, len);
        if (job->residual) add_residual(x, job->residual + start, len);
        float *read = job->decoded ? job->decoded + start : job->residual ? reads : NULL;
        encode_chunk(job, x, read, start, len);
        if (job->residual) keep_residual(job->residual + start, x, read, len);
    }
    return 0;
}
