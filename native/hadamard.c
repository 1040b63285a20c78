/* The DDP hook's randomized Hadamard transform: random signs, then an orthonormal Walsh-Hadamard
 * transform of each block, in place, in one pass over memory per block (a block of up to 16K floats
 * stays in cache through its log2(block) butterfly stages).
 *
 * Signs come from splitmix64 of (seed + e / 64), bit e % 64: the same on every rank for one seed,
 * without drawing or storing a tensor of them. The transform is its own inverse up to the signs:
 * inverse = transform, then signs. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "compute.h"
#include "contribution.h"
#include "error.h"

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* x[i] = -x[i] where element first + i draws a minus sign: its sign bit flipped, 64 elements a
 * draw, with no branch on a coin toss (the loop vectorises). */
VECTOR_CLONES static void flip_signs(float *x, uint64_t len, uint64_t seed, uint64_t first) {
    for (uint64_t i = 0; i < len;) {
        uint64_t e = first + i, draw = splitmix64(seed + e / 64);
        uint32_t from = (uint32_t)(e % 64), run = (uint32_t)(64 - from < len - i ? 64 - from : len - i);
        uint32_t u[64];
        memcpy(u, x + i, (size_t)run * 4);
        for (uint32_t j = 0; j < run; j++) u[j] ^= (uint32_t)((draw >> (from + j)) & 1) << 31;
        memcpy(x + i, u, (size_t)run * 4);
        i += run;
    }
}

/* One butterfly stage over two halves that do not overlap: (a, b) -> (a + b, a - b). */
static inline void butterflies(float *restrict a, float *restrict b, uint32_t h) {
    for (uint32_t j = 0; j < h; j++) {
        float u = a[j], v = b[j];
        a[j] = u + v;
        b[j] = u - v;
    }
}

/* Two stages at once over four quarters that do not overlap (one pass over memory for two). */
static inline void butterflies2(float *restrict a, float *restrict b, float *restrict c, float *restrict d,
                                uint32_t h) {
    for (uint32_t j = 0; j < h; j++) {
        float s0 = a[j] + b[j], d0 = a[j] - b[j], s1 = c[j] + d[j], d1 = c[j] - d[j];
        a[j] = s0 + s1;
        b[j] = d0 + d1;
        c[j] = s0 - s1;
        d[j] = d0 - d1;
    }
}

/* The first three stages on 8 floats at once (their halves are too short for vectors). */
static inline void first_stages(float *x) {
    float a0 = x[0] + x[1], a1 = x[0] - x[1], a2 = x[2] + x[3], a3 = x[2] - x[3];
    float a4 = x[4] + x[5], a5 = x[4] - x[5], a6 = x[6] + x[7], a7 = x[6] - x[7];
    float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    x[0] = b0 + b4, x[1] = b1 + b5, x[2] = b2 + b6, x[3] = b3 + b7;
    x[4] = b0 - b4, x[5] = b1 - b5, x[6] = b2 - b6, x[7] = b3 - b7;
}

/* The orthonormal transform of one block of n = 2^k floats, in place. */
VECTOR_CLONES static void walsh_hadamard(float *x, uint32_t n) {
    uint32_t h = 1;
    if (n >= 8) {
        for (uint32_t i = 0; i < n; i += 8) first_stages(x + i);
        h = 8;
    }
    for (; 4 * h <= n; h *= 4)
        for (uint32_t i = 0; i < n; i += 4 * h) butterflies2(x + i, x + i + h, x + i + 2 * h, x + i + 3 * h, h);
    if (h < n)
        for (uint32_t i = 0; i < n; i += 2 * h) butterflies(x + i, x + i + h, h);
    float scale = 1.0f / sqrtf((float)n);
    for (uint32_t j = 0; j < n; j++) x[j] *= scale;
}

int p2p_hadamard(float *x, uint64_t n, uint32_t block, uint64_t seed, int inverse) {
    if (!block || (block & (block - 1)) || block > (1u << 24))
        return set_error(EINVAL, "hadamard: a block of %u elements (a power of 2 up to 2^24)", block);
    if (n % block) return set_error(EINVAL, "hadamard: %llu elements are not whole blocks of %u",
                                    (unsigned long long)n, block);
    if (n && !x) return set_error(EINVAL, "hadamard: no tensor");
    for (uint64_t start = 0; start < n; start += block) {
        if (!inverse) flip_signs(x + start, block, seed, start);
        walsh_hadamard(x + start, block);
        if (inverse) flip_signs(x + start, block, seed, start);
    }
    return 0;
}
