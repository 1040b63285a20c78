/* What the compute module's loops share (the merge, the change's size): reading the 16-bit float
 * formats that travel (binary16, bfloat16 bits) as float, and building hot loops for AVX2 too. */
#ifndef P2P_KERNELS_H
#define P2P_KERNELS_H

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

static inline float f16_to_float(uint16_t h) {
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

static inline float bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
