/* GHASH with VPCLMULQDQ (ghash.h). */
#include "ghash.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* FAST: the 128- and 256-bit code every CPU that runs this file has; WIDE: the 512-bit loop. A
 * FAST function inlines into a WIDE one (its target is a subset), never the other way round. */
#define FAST __attribute__((target("avx2,vpclmulqdq,pclmul,ssse3")))
#define WIDE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,vpclmulqdq,pclmul,ssse3")))

int ghash_fast_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
           __builtin_cpu_supports("pclmul");
}

/* Whether the 512-bit loop runs here (and P2P_GHASH_256 does not ask for the 256-bit one). */
static int wide_available(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && !getenv("P2P_GHASH_256");
}

FAST static inline __m128i reversed(__m128i x) {
    return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* The 256-bit product lo ^ mid << 64 ^ hi << 128 of two byte-reversed elements, shifted left one
 * bit (the operands' bit order is reflected) and reduced modulo GCM's polynomial. */
FAST static inline __m128i reduce(__m128i lo, __m128i mid, __m128i hi) {
    lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    /* [hi:lo] <<= 1 */
    __m128i lo_carry = _mm_srli_epi32(lo, 31), hi_carry = _mm_srli_epi32(hi, 31);
    lo = _mm_slli_epi32(lo, 1);
    hi = _mm_slli_epi32(hi, 1);
    __m128i across = _mm_srli_si128(lo_carry, 12);
    hi_carry = _mm_slli_si128(hi_carry, 4);
    lo_carry = _mm_slli_si128(lo_carry, 4);
    lo = _mm_or_si128(lo, lo_carry);
    hi = _mm_or_si128(_mm_or_si128(hi, hi_carry), across);
    /* reduce: first phase */
    __m128i a = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi32(lo, 31), _mm_slli_epi32(lo, 30)), _mm_slli_epi32(lo, 25));
    __m128i a_high = _mm_srli_si128(a, 4);
    lo = _mm_xor_si128(lo, _mm_slli_si128(a, 12));
    /* second phase */
    __m128i b = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi32(lo, 1), _mm_srli_epi32(lo, 2)), _mm_srli_epi32(lo, 7));
    b = _mm_xor_si128(b, a_high);
    lo = _mm_xor_si128(lo, b);
    return _mm_xor_si128(hi, lo);
}

FAST static inline __m128i multiply(__m128i a, __m128i b) {
    __m128i mid = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x10), _mm_clmulepi64_si128(a, b, 0x01));
    return reduce(_mm_clmulepi64_si128(a, b, 0x00), mid, _mm_clmulepi64_si128(a, b, 0x11));
}

WIDE static inline __m128i lanes_xor(__m512i v) {
    return _mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(v, 0), _mm512_extracti32x4_epi32(v, 1)),
                         _mm_xor_si128(_mm512_extracti32x4_epi32(v, 2), _mm512_extracti32x4_epi32(v, 3)));
}

/* The unreduced products of 4 blocks (x, one per lane) with 4 powers of H (h), added to lo, mid, hi. */
#define MULTIPLY_LANES(x, h, lo, mid, hi)                                                                \
    do {                                                                                                 \
        lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h, 0x00));                                 \
        hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h, 0x11));                                 \
        mid = _mm512_xor_si512(mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(x, h, 0x01),               \
                                                     _mm512_clmulepi64_epi128(x, h, 0x10)));             \
    } while (0)

/* y over nblocks whole blocks at p: GHASH_POWERS at a time (the powers H^n..H^1 against blocks
 * 1..n, one reduction for all: the chain from one y to the next, not the multiplies, sets the
 * speed), then 4 at a time, then one. */
WIDE static __m128i hash_blocks_wide(const struct ghash_key *k, __m128i y, const uint8_t *p, size_t nblocks) {
    const __m512i order = _mm512_broadcast_i32x4(
        _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (; nblocks >= GHASH_POWERS; nblocks -= GHASH_POWERS, p += 16 * GHASH_POWERS) {
        __m512i x = _mm512_xor_si512(_mm512_shuffle_epi8(_mm512_loadu_si512(p), order), _mm512_zextsi128_si512(y));
        __m512i h = _mm512_loadu_si512(k->powers[0]);
        __m512i lo = _mm512_clmulepi64_epi128(x, h, 0x00), hi = _mm512_clmulepi64_epi128(x, h, 0x11);
        __m512i mid = _mm512_xor_si512(_mm512_clmulepi64_epi128(x, h, 0x01), _mm512_clmulepi64_epi128(x, h, 0x10));
        for (int i = 4; i < GHASH_POWERS; i += 4) {
            x = _mm512_shuffle_epi8(_mm512_loadu_si512(p + 16 * i), order);
            h = _mm512_loadu_si512(k->powers[i]);
            MULTIPLY_LANES(x, h, lo, mid, hi);
        }
        y = reduce(lanes_xor(lo), lanes_xor(mid), lanes_xor(hi));
    }
    const __m512i h4 = _mm512_loadu_si512(k->powers[GHASH_POWERS - 4]);  /* H^4..H^1 */
    for (; nblocks >= 4; nblocks -= 4, p += 64) {
        __m512i x = _mm512_xor_si512(_mm512_shuffle_epi8(_mm512_loadu_si512(p), order), _mm512_zextsi128_si512(y));
        __m512i lo = _mm512_setzero_si512(), mid = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        MULTIPLY_LANES(x, h4, lo, mid, hi);
        y = reduce(lanes_xor(lo), lanes_xor(mid), lanes_xor(hi));
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)k->powers[GHASH_POWERS - 1]);
    for (; nblocks; nblocks--, p += 16)
        y = multiply(_mm_xor_si128(y, reversed(_mm_loadu_si128((const __m128i *)p))), h);
    return y;
}

FAST static inline __m128i halves_xor(__m256i v) {
    return _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* hash_blocks_wide's way with 2 blocks to a 256-bit register (CPUs with VPCLMULQDQ, no AVX-512):
 * GHASH_POWERS at a time, one reduction for all, then 2 at a time, then one. */
FAST static __m128i hash_blocks(const struct ghash_key *k, __m128i y, const uint8_t *p, size_t nblocks) {
    if (k->wide) return hash_blocks_wide(k, y, p, nblocks);
    const __m256i order = _mm256_broadcastsi128_si256(
        _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (; nblocks >= GHASH_POWERS; nblocks -= GHASH_POWERS, p += 16 * GHASH_POWERS) {
        __m256i x = _mm256_xor_si256(_mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)p), order),
                                     _mm256_zextsi128_si256(y));
        __m256i h = _mm256_loadu_si256((const __m256i *)k->powers[0]);
        __m256i lo = _mm256_clmulepi64_epi128(x, h, 0x00), hi = _mm256_clmulepi64_epi128(x, h, 0x11);
        __m256i mid = _mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x01), _mm256_clmulepi64_epi128(x, h, 0x10));
        for (int i = 2; i < GHASH_POWERS; i += 2) {
            x = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p + 16 * i)), order);
            h = _mm256_loadu_si256((const __m256i *)k->powers[i]);
            lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h, 0x00));
            hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h, 0x11));
            mid = _mm256_xor_si256(mid, _mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x01),
                                                         _mm256_clmulepi64_epi128(x, h, 0x10)));
        }
        y = reduce(halves_xor(lo), halves_xor(mid), halves_xor(hi));
    }
    const __m256i h2 = _mm256_loadu_si256((const __m256i *)k->powers[GHASH_POWERS - 2]);  /* H^2, H^1 */
    for (; nblocks >= 2; nblocks -= 2, p += 32) {
        __m256i x = _mm256_xor_si256(_mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)p), order),
                                     _mm256_zextsi128_si256(y));
        __m256i mid = _mm256_xor_si256(_mm256_clmulepi64_epi128(x, h2, 0x01), _mm256_clmulepi64_epi128(x, h2, 0x10));
        y = reduce(halves_xor(_mm256_clmulepi64_epi128(x, h2, 0x00)), halves_xor(mid),
                   halves_xor(_mm256_clmulepi64_epi128(x, h2, 0x11)));
    }
    if (nblocks) {
        const __m128i h = _mm_loadu_si128((const __m128i *)k->powers[GHASH_POWERS - 1]);
        y = multiply(_mm_xor_si128(y, reversed(_mm_loadu_si128((const __m128i *)p))), h);
    }
    return y;
}

FAST void ghash_key_init(struct ghash_key *k, const uint8_t h[16]) {
    k->wide = wide_available();
    __m128i h1 = reversed(_mm_loadu_si128((const __m128i *)h)), power = h1;
    for (int i = GHASH_POWERS - 1; i >= 0; i--) {
        _mm_storeu_si128((__m128i *)k->powers[i], power);
        power = multiply(power, h1);
    }
}

void ghash_start(struct ghash_state *s) {
    memset(s, 0, sizeof *s);
}

FAST void ghash_update(const struct ghash_key *k, struct ghash_state *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->bytes += len;
    __m128i y = _mm_loadu_si128((const __m128i *)s->y);
    if (s->npartial) {
        size_t take = 16 - s->npartial < len ? 16 - s->npartial : len;
        memcpy(s->partial + s->npartial, p, take);
        s->npartial += take;
        p += take;
        len -= take;
        if (s->npartial < 16) return;
        y = hash_blocks(k, y, s->partial, 1);
        s->npartial = 0;
    }
    y = hash_blocks(k, y, p, len / 16);
    memcpy(s->partial, p + len / 16 * 16, len % 16);
    s->npartial = len % 16;
    _mm_storeu_si128((__m128i *)s->y, y);
}

FAST void ghash_finish(const struct ghash_key *k, struct ghash_state *s, uint8_t out[16]) {
    __m128i y = _mm_loadu_si128((const __m128i *)s->y);
    if (s->npartial) {
        memset(s->partial + s->npartial, 0, 16 - s->npartial);
        y = hash_blocks(k, y, s->partial, 1);
    }
    uint8_t lengths[16] = {0};  /* the additional data's length in bits, big-endian; no ciphertext */
    uint64_t bits = s->bytes * 8;
    for (int i = 0; i < 8; i++) lengths[i] = (uint8_t)(bits >> (56 - 8 * i));
    y = hash_blocks(k, y, lengths, 1);
    _mm_storeu_si128((__m128i *)out, reversed(y));
}

#else  /* not x86-64: OpenSSL's GHASH only */

int ghash_fast_available(void) { return 0; }
void ghash_key_init(struct ghash_key *k, const uint8_t h[16]) { (void)k; (void)h; }
void ghash_start(struct ghash_state *s) { memset(s, 0, sizeof *s); }
void ghash_update(const struct ghash_key *k, struct ghash_state *s, const void *data, size_t len) {
    (void)k; (void)s; (void)data; (void)len;
}
void ghash_finish(const struct ghash_key *k, struct ghash_state *s, uint8_t out[16]) {
    (void)k; (void)s; memset(out, 0, 16);
}

#endif
