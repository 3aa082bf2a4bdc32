/* Vector helpers shared by the engine's C kernels (cpu_kernels.py), for their two builds.
 *
 * The kernels are written once, on 16-lane vectors: f32x16 (float), i32x16 (int32) and mask16 (the
 * lanes of a tail). In the "vnni" build (AVX512) each is one zmm register and each operation the
 * AVX512 instruction. In the "avx2" build (AVX2, FMA, F16C) each is a pair of ymm halves, lanes 0-7
 * and 8-15, and each operation does the same IEEE operation on every lane; the reductions take gcc's
 * _mm512_reduce_* order (upper half op lower half over 256 bits, then 128, then the 64-bit swap,
 * then lane 0 op lane 1), and 2^n in exp is built where AVX512 has VSCALEFPS. So both builds return
 * bit for bit the same results for the same inputs (tests/engine: the builds against each other),
 * and a host's answers do not depend on which build it runs.
 */
#ifndef SIMD_H
#define SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Every helper inlined, so that the AVX2 build's pairs stay in registers instead of crossing calls
 * in memory. */
#define SIMD_INLINE static inline __attribute__((always_inline))

#ifdef __AVX512F__

typedef __m512 f32x16;
typedef __m512i i32x16;
typedef __mmask16 mask16;

SIMD_INLINE f32x16 f32x16_load(const float *p) { return _mm512_loadu_ps(p); }
SIMD_INLINE void f32x16_store(float *p, f32x16 v) { _mm512_storeu_ps(p, v); }
SIMD_INLINE f32x16 f32x16_load_ph(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* Narrowed to float16, rounded to nearest even. */
SIMD_INLINE void f32x16_store_ph(uint16_t *p, f32x16 v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
SIMD_INLINE f32x16 f32x16_set1(float a) { return _mm512_set1_ps(a); }
SIMD_INLINE f32x16 f32x16_zero(void) { return _mm512_setzero_ps(); }
SIMD_INLINE f32x16 f32x16_add(f32x16 a, f32x16 b) { return _mm512_add_ps(a, b); }
SIMD_INLINE f32x16 f32x16_sub(f32x16 a, f32x16 b) { return _mm512_sub_ps(a, b); }
SIMD_INLINE f32x16 f32x16_mul(f32x16 a, f32x16 b) { return _mm512_mul_ps(a, b); }
SIMD_INLINE f32x16 f32x16_div(f32x16 a, f32x16 b) { return _mm512_div_ps(a, b); }
SIMD_INLINE f32x16 f32x16_min(f32x16 a, f32x16 b) { return _mm512_min_ps(a, b); }
SIMD_INLINE f32x16 f32x16_max(f32x16 a, f32x16 b) { return _mm512_max_ps(a, b); }
/* a * b + c and c - a * b, each rounded once. */
SIMD_INLINE f32x16 f32x16_fmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fmadd_ps(a, b, c); }
SIMD_INLINE f32x16 f32x16_fnmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fnmadd_ps(a, b, c); }
SIMD_INLINE f32x16 f32x16_abs(f32x16 v) { return _mm512_abs_ps(v); }
SIMD_INLINE f32x16 f32x16_round(f32x16 v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for whole n (exp takes n in -126..127). */
SIMD_INLINE f32x16 f32x16_scalef(f32x16 p, f32x16 n) { return _mm512_scalef_ps(p, n); }
/* To int32 rounded to nearest even, and back. */
SIMD_INLINE i32x16 f32x16_to_i32(f32x16 v) { return _mm512_cvtps_epi32(v); }
SIMD_INLINE f32x16 i32x16_to_f32(i32x16 v) { return _mm512_cvtepi32_ps(v); }
SIMD_INLINE i32x16 i32x16_set1(int a) { return _mm512_set1_epi32(a); }
SIMD_INLINE i32x16 i32x16_min(i32x16 a, i32x16 b) { return _mm512_min_epi32(a, b); }
SIMD_INLINE i32x16 i32x16_max(i32x16 a, i32x16 b) { return _mm512_max_epi32(a, b); }
/* The 16 lanes as int8, saturated. */
SIMD_INLINE void i32x16_store_i8(int8_t *p, i32x16 v) { _mm_storeu_si128((__m128i *)p, _mm512_cvtsepi32_epi8(v)); }
SIMD_INLINE float f32x16_reduce_add(f32x16 v) { return _mm512_reduce_add_ps(v); }
SIMD_INLINE float f32x16_reduce_max(f32x16 v) { return _mm512_reduce_max_ps(v); }
SIMD_INLINE int i32x16_reduce_add(i32x16 v) { return _mm512_reduce_add_epi32(v); }
/* Lanes 0..n-1 (n <= 16). */
SIMD_INLINE mask16 mask16_first(int n) { return (__mmask16)((1u << n) - 1u); }
/* max(a, b) in the lanes of m, src in the others; v in the lanes of m, 0 in the others. */
SIMD_INLINE f32x16 f32x16_mask_max(f32x16 src, mask16 m, f32x16 a, f32x16 b) { return _mm512_mask_max_ps(src, m, a, b); }
SIMD_INLINE f32x16 f32x16_maskz(mask16 m, f32x16 v) { return _mm512_maskz_mov_ps(m, v); }
/* Within each 128-bit block: [a0, b0, a1, b1] and [a2, b2, a3, b3]; then the same with 64-bit elements. */
SIMD_INLINE f32x16 f32x16_unpacklo(f32x16 a, f32x16 b) { return _mm512_unpacklo_ps(a, b); }
SIMD_INLINE f32x16 f32x16_unpackhi(f32x16 a, f32x16 b) { return _mm512_unpackhi_ps(a, b); }
SIMD_INLINE f32x16 f32x16_unpacklo64(f32x16 a, f32x16 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
SIMD_INLINE f32x16 f32x16_unpackhi64(f32x16 a, f32x16 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
/* 128-bit blocks [a0, a2, b0, b2] and [a1, a3, b1, b3]. */
SIMD_INLINE f32x16 f32x16_even_blocks(f32x16 a, f32x16 b) { return _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)); }
SIMD_INLINE f32x16 f32x16_odd_blocks(f32x16 a, f32x16 b) { return _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)); }

/* acc += w (16 lanes of 4 unsigned bytes) . the 4 signed bytes at p, broadcast to every lane
 * (AVX512-VNNI). Written out so that the broadcast is VPDPBUSD's own memory operand: gcc loads it with
 * a separate VPBROADCASTD, and with that extra instruction per product 8 rows of the int4 kernel took
 * 6-18% longer. */
SIMD_INLINE __m512i dot4(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %[p]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [p] "m"(*(const int32_t *)p));
    return acc;
}

#else /* AVX2, FMA, F16C: lanes 0-7 in lo, 8-15 in hi */

typedef struct { __m256 lo, hi; } f32x16;
typedef struct { __m256i lo, hi; } i32x16;
typedef struct { __m256 lo, hi; } mask16; /* all ones in the lanes it holds */

#define F32X16_MAP(fn, a, b) ((f32x16){fn((a).lo, (b).lo), fn((a).hi, (b).hi)})
#define I32X16_MAP(fn, a, b) ((i32x16){fn((a).lo, (b).lo), fn((a).hi, (b).hi)})

SIMD_INLINE f32x16 f32x16_load(const float *p) { return (f32x16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
SIMD_INLINE void f32x16_store(float *p, f32x16 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
SIMD_INLINE f32x16 f32x16_load_ph(const uint16_t *p) {
    return (f32x16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
SIMD_INLINE void f32x16_store_ph(uint16_t *p, f32x16 v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)(p + 8), _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
SIMD_INLINE f32x16 f32x16_set1(float a) { return (f32x16){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
SIMD_INLINE f32x16 f32x16_zero(void) { return (f32x16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
SIMD_INLINE f32x16 f32x16_add(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_add_ps, a, b); }
SIMD_INLINE f32x16 f32x16_sub(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_sub_ps, a, b); }
SIMD_INLINE f32x16 f32x16_mul(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_mul_ps, a, b); }
SIMD_INLINE f32x16 f32x16_div(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_div_ps, a, b); }
SIMD_INLINE f32x16 f32x16_min(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_min_ps, a, b); }
SIMD_INLINE f32x16 f32x16_max(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_max_ps, a, b); }
SIMD_INLINE f32x16 f32x16_fmadd(f32x16 a, f32x16 b, f32x16 c) {
    return (f32x16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
SIMD_INLINE f32x16 f32x16_fnmadd(f32x16 a, f32x16 b, f32x16 c) {
    return (f32x16){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
/* The sign bit cleared, as VPANDD does for _mm512_abs_ps. */
SIMD_INLINE f32x16 f32x16_abs(f32x16 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return (f32x16){_mm256_andnot_ps(sign, v.lo), _mm256_andnot_ps(sign, v.hi)};
}
SIMD_INLINE f32x16 f32x16_round(f32x16 v) {
    return (f32x16){_mm256_round_ps(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    _mm256_round_ps(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
/* VSCALEFPS rounds p * 2^n once. For whole n in -126..127, 2^n is a normal float, made here from its
 * exponent bits: one product, rounded the same way, subnormal results included. */
SIMD_INLINE f32x16 f32x16_scalef(f32x16 p, f32x16 n) {
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23));
    const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23));
    return (f32x16){_mm256_mul_ps(p.lo, lo), _mm256_mul_ps(p.hi, hi)};
}
SIMD_INLINE i32x16 f32x16_to_i32(f32x16 v) { return (i32x16){_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }
SIMD_INLINE f32x16 i32x16_to_f32(i32x16 v) { return (f32x16){_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
SIMD_INLINE i32x16 i32x16_set1(int a) { return (i32x16){_mm256_set1_epi32(a), _mm256_set1_epi32(a)}; }
SIMD_INLINE i32x16 i32x16_min(i32x16 a, i32x16 b) { return I32X16_MAP(_mm256_min_epi32, a, b); }
SIMD_INLINE i32x16 i32x16_max(i32x16 a, i32x16 b) { return I32X16_MAP(_mm256_max_epi32, a, b); }
/* Saturated to int16, then to int8: the same as saturating to int8 at once. */
SIMD_INLINE void i32x16_store_i8(int8_t *p, i32x16 v) {
    const __m128i lo = _mm_packs_epi32(_mm256_castsi256_si128(v.lo), _mm256_extracti128_si256(v.lo, 1));
    const __m128i hi = _mm_packs_epi32(_mm256_castsi256_si128(v.hi), _mm256_extracti128_si256(v.hi, 1));
    _mm_storeu_si128((__m128i *)p, _mm_packs_epi16(lo, hi));
}
/* gcc's _mm512_reduce_add_ps, step by step: (upper 256 + lower 256), (upper 128 + lower 128), that
 * plus its 64-bit halves swapped, then lane 0 + lane 1. */
SIMD_INLINE float f32x16_reduce_add(f32x16 v) {
    const __m256 t3 = _mm256_add_ps(v.hi, v.lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}
/* gcc's _mm512_reduce_max_ps: MAXPS keeps its second operand where a comparison fails (NaN, or
 * -0 against +0), so the operands go in gcc's order, upper first. */
SIMD_INLINE float f32x16_reduce_max(f32x16 v) {
    const __m256 t3 = _mm256_max_ps(v.hi, v.lo);
    const __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1))));
}
SIMD_INLINE int i32x16_reduce_add(i32x16 v) { /* whole numbers: any order gives the same sum */
    const __m256i t3 = _mm256_add_epi32(v.hi, v.lo);
    const __m128i t6 = _mm_add_epi32(_mm256_extracti128_si256(t3, 1), _mm256_castsi256_si128(t3));
    const __m128i t8 = _mm_add_epi32(t6, _mm_shuffle_epi32(t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(t8) + _mm_extract_epi32(t8, 1);
}
SIMD_INLINE mask16 mask16_first(int n) {
    const __m256i at = _mm256_set1_epi32(n);
    return (mask16){_mm256_castsi256_ps(_mm256_cmpgt_epi32(at, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(at, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)))};
}
SIMD_INLINE f32x16 f32x16_mask_max(f32x16 src, mask16 m, f32x16 a, f32x16 b) {
    return (f32x16){_mm256_blendv_ps(src.lo, _mm256_max_ps(a.lo, b.lo), m.lo), _mm256_blendv_ps(src.hi, _mm256_max_ps(a.hi, b.hi), m.hi)};
}
SIMD_INLINE f32x16 f32x16_maskz(mask16 m, f32x16 v) { return (f32x16){_mm256_and_ps(m.lo, v.lo), _mm256_and_ps(m.hi, v.hi)}; }
/* AVX2's unpacks work within 128-bit blocks as AVX512's do. */
SIMD_INLINE f32x16 f32x16_unpacklo(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_unpacklo_ps, a, b); }
SIMD_INLINE f32x16 f32x16_unpackhi(f32x16 a, f32x16 b) { return F32X16_MAP(_mm256_unpackhi_ps, a, b); }
SIMD_INLINE f32x16 f32x16_unpacklo64(f32x16 a, f32x16 b) {
    return (f32x16){_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a.lo), _mm256_castps_pd(b.lo))),
                    _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a.hi), _mm256_castps_pd(b.hi)))};
}
SIMD_INLINE f32x16 f32x16_unpackhi64(f32x16 a, f32x16 b) {
    return (f32x16){_mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a.lo), _mm256_castps_pd(b.lo))),
                    _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a.hi), _mm256_castps_pd(b.hi)))};
}
/* _mm512_shuffle_f32x4's block picks: a's blocks 0, 2 (its halves' low blocks) then b's; likewise 1, 3. */
SIMD_INLINE f32x16 f32x16_even_blocks(f32x16 a, f32x16 b) {
    return (f32x16){_mm256_permute2f128_ps(a.lo, a.hi, 0x20), _mm256_permute2f128_ps(b.lo, b.hi, 0x20)};
}
SIMD_INLINE f32x16 f32x16_odd_blocks(f32x16 a, f32x16 b) {
    return (f32x16){_mm256_permute2f128_ps(a.lo, a.hi, 0x31), _mm256_permute2f128_ps(b.lo, b.hi, 0x31)};
}

/* The 4 bytes at p in every 32-bit lane: the activations' operand in the AVX2 build's matmul loops,
 * which take VPMADDUBSW and VPMADDWD where the VNNI build has dot4 (memcpy: a load that does not read
 * int8 data through an int32 pointer). */
SIMD_INLINE __m256i broadcast4(const int8_t *p) {
    int32_t quad;
    memcpy(&quad, p, 4);
    return _mm256_set1_epi32(quad);
}

#undef F32X16_MAP
#undef I32X16_MAP

#endif

/* exp(x) on 16 floats to about 2 ulp: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for
 * e^r, then scaled by 2^n. Inputs are clamped to [-87, 88]: e^-87 is the smallest normal float's
 * order, e^88 below the largest float (so n stays within -126..127). */
SIMD_INLINE f32x16 f32x16_exp(f32x16 x) {
    x = f32x16_min(f32x16_max(x, f32x16_set1(-87.0f)), f32x16_set1(88.0f));
    const f32x16 n = f32x16_round(f32x16_mul(x, f32x16_set1(1.44269504088896341f)));
    f32x16 r = f32x16_fnmadd(n, f32x16_set1(0.693359375f), x);
    r = f32x16_fnmadd(n, f32x16_set1(-2.12194440e-4f), r);
    f32x16 p = f32x16_set1(1.9875691500e-4f);
    p = f32x16_fmadd(p, r, f32x16_set1(1.3981999507e-3f));
    p = f32x16_fmadd(p, r, f32x16_set1(8.3334519073e-3f));
    p = f32x16_fmadd(p, r, f32x16_set1(4.1665795894e-2f));
    p = f32x16_fmadd(p, r, f32x16_set1(1.6666665459e-1f));
    p = f32x16_fmadd(p, r, f32x16_set1(5.0000001201e-1f));
    p = f32x16_fmadd(p, f32x16_mul(r, r), f32x16_add(r, f32x16_set1(1.0f)));
    return f32x16_scalef(p, n);
}

/* 16 floats v as whole numbers hi + lo / 256 of a step (the engine's 15-bit activations, held as two
 * int8 passes): hi = round(v * inv) to nearest even, lo = the rounding error in 1/256 of a step,
 * clamped to +-127 (it reaches 128 only within 1/256 of a step of hi's rounding boundary). inv is
 * 1 / step and inv_fine 256 / step, both 0 for a zero step. */
SIMD_INLINE void split_hi_lo(f32x16 v, float step, f32x16 inv, f32x16 inv_fine, i32x16 *hi, i32x16 *lo) {
    *hi = f32x16_to_i32(f32x16_mul(v, inv));
    const f32x16 rest = f32x16_fnmadd(i32x16_to_f32(*hi), f32x16_set1(step), v);
    const i32x16 fine = f32x16_to_i32(f32x16_mul(rest, inv_fine));
    *lo = i32x16_max(i32x16_min(fine, i32x16_set1(127)), i32x16_set1(-127));
}

/* Lane j of the result: the sum of v[j]'s 16 lanes. A transposing tree of 45 shuffles and adds for
 * the 16 sums, against about 8 dependent instructions for each one alone (f32x16_reduce_add). */
SIMD_INLINE f32x16 f32x16_sum_lanes16(const f32x16 *v) {
    f32x16 pairs[8], quads[4], octs[2];
    for (int i = 0; i < 8; i++) /* per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] for v[2i], v[2i+1] */
        pairs[i] = f32x16_add(f32x16_unpacklo(v[2 * i], v[2 * i + 1]), f32x16_unpackhi(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per block: the block's sum for each of 4 vectors */
        quads[i] = f32x16_add(f32x16_unpacklo64(pairs[2 * i], pairs[2 * i + 1]), f32x16_unpackhi64(pairs[2 * i], pairs[2 * i + 1]));
    for (int i = 0; i < 2; i++) /* blocks 0+1 and 2+3, for 8 vectors */
        octs[i] = f32x16_add(f32x16_even_blocks(quads[2 * i], quads[2 * i + 1]), f32x16_odd_blocks(quads[2 * i], quads[2 * i + 1]));
    return f32x16_add(f32x16_even_blocks(octs[0], octs[1]), f32x16_odd_blocks(octs[0], octs[1]));
}

#endif
