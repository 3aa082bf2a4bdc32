/* Vector helpers shared by the engine's C kernels (cpu_kernels.py). */
#ifndef SIMD_H
#define SIMD_H

#include <immintrin.h>
#include <stdint.h>

/* exp(x) on 16 floats (AVX512F) to about 2 ulp: x = n ln2 + r with |r| <= ln2 / 2, a degree-7
 * polynomial for e^r, then scaled by 2^n. Inputs are clamped to [-87, 88]: e^-87 is the smallest
 * normal float's order, e^88 below the largest float. */
static inline __m512 exp512(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
    const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* acc += w (16 lanes of 4 unsigned bytes) . the 4 signed bytes at p, broadcast to every lane
 * (AVX512-VNNI). Written out so that the broadcast is VPDPBUSD's own memory operand: gcc loads it with
 * a separate VPBROADCASTD, and with that extra instruction per product 8 rows of the int4 kernel took
 * 6-18% longer. */
static inline __m512i dot4(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %[p]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [p] "m"(*(const int32_t *)p));
    return acc;
}

/* 16 floats v as whole numbers hi + lo / 256 of a step (the engine's 15-bit activations, held as two
 * int8 passes): hi = round(v * inv) to nearest even, lo = the rounding error in 1/256 of a step,
 * clamped to +-127 (it reaches 128 only within 1/256 of a step of hi's rounding boundary). inv is
 * 1 / step and inv_fine 256 / step, both 0 for a zero step. */
static inline void split_hi_lo(__m512 v, float step, __m512 inv, __m512 inv_fine, __m512i *hi, __m512i *lo) {
    *hi = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
    const __m512 rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(*hi), _mm512_set1_ps(step), v);
    const __m512i fine = _mm512_cvtps_epi32(_mm512_mul_ps(rest, inv_fine));
    *lo = _mm512_max_epi32(_mm512_min_epi32(fine, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

#endif
