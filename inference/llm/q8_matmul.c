/* y = x @ W for W in symmetric per-output-channel int8 (the output head), on AVX512-VNNI or AVX2.
 * Built with the engine's other kernels into one library per instruction set by cpu_kernels.py.
 *
 * Each row of x is written as step * (hi + lo / 256) over the whole row: hi = round(x / step) with
 * step = max|x| / 127, lo the rounding error in 1/256 of a step (clamped to +-127), both int8. The
 * weights are stored offset by 128 (VPDPBUSD multiplies unsigned by signed bytes), and the offset's
 * share, 128 * sum(hi) and 128 * sum(lo), is taken off the int32 sums. A tile of 16 outputs loads each
 * 64 bytes of its weights once for all the rows of a block and both passes: 2 * rows independent
 * VPDPBUSD chains. oneDNN's int8 GEMM (the rows of both passes stacked) took 1.0 ms more for 8 rows
 * than for 1 over this 49152 x 576 head; its weight bytes (28 MB) bound one row either way.
 * Whole numbers add up exactly, so a row's result does not depend on the batch, nor on the build.
 *
 * The weight blob: for each tile of 16 outputs, for each quad of 4 inputs, 64 bytes: byte 4*j + i is
 * output j's input 4*quad + i, plus 128.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define TILE 16
/* Rows multiplied together on each tile's weights, their sums in registers: 8 in AVX512's 32 zmm, 3 in
 * AVX2's 16 ymm (the 8-row head took 3% longer in blocks of 4, 6% in blocks of 2). 3 or 8: the switch in
 * q8_matmul has a case for every smaller block. What the int32 sums hold beyond sum(w * x): 128 *
 * sum(x) for VPDPBUSD's unsigned weights; nothing for the AVX2 loop, which takes them back to signed. */
#ifdef __AVX512F__
#define MAX_ROWS 8
#define WEIGHT_OFFSET 128
#else
#define MAX_ROWS 3
#define WEIGHT_OFFSET 0
#endif
/* Weights are read once a step, from memory: fetched this far ahead (4 KB) into L1, the 8-row head
 * took 1.5 instead of 2.2 ms a step in the engine's forward, 1 row 1.0 instead of 1.2 ms; into L2
 * from PREFETCH_QUADS_L2 ahead (8 KB) as well, 8 rows 1.05 instead of 1.17 ms (alternated). */
#define PREFETCH_QUADS 64
#define PREFETCH_QUADS_L2 128

/* Rows in blocks of MAX_ROWS (the last may be shorter, n rows): for block row r0, at qx + 2 * r0 * k,
 * quad by quad the n rows' 4 hi bytes, then likewise the lo bytes; per row its step and the offset
 * corrections WEIGHT_OFFSET * sum(hi), WEIGHT_OFFSET * sum(lo). */
static void quantize_rows(const float *x, int rows, int k, int8_t *qx, float *steps, int32_t *offsets) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int r = 0; r < rows; r++) {
        const int r0 = r - r % MAX_ROWS;
        const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
        const float *row = x + (size_t)r * k;
        f32x16 top = f32x16_zero();
        for (int i = 0; i < k; i += 16) top = f32x16_max(top, f32x16_abs(f32x16_load(row + i)));
        const float amax = f32x16_reduce_max(top);
        const float step = amax > 0.0f ? amax / 127.0f : 1.0f;
        const f32x16 inv = f32x16_set1(amax > 0.0f ? 127.0f / amax : 0.0f);
        const f32x16 inv_fine = f32x16_set1(amax > 0.0f ? 256.0f * 127.0f / amax : 0.0f);
        int8_t *hi = qx + (size_t)2 * r0 * k + (size_t)(r - r0) * 4;
        int8_t *lo = hi + (size_t)n * k;
        int32_t sum_hi = 0, sum_lo = 0;
        for (int i = 0; i < k; i += 16) {
            i32x16 qh, ql;
            split_hi_lo(f32x16_load(row + i), step, inv, inv_fine, &qh, &ql);
            int8_t h8[16], l8[16];
            i32x16_store_i8(h8, qh);
            i32x16_store_i8(l8, ql);
            for (int q = 0; q < 4; q++) { /* input quad i/4 + q of this row, among the block's rows */
                memcpy(hi + ((size_t)(i / 4 + q) * n) * 4, h8 + 4 * q, 4);
                memcpy(lo + ((size_t)(i / 4 + q) * n) * 4, l8 + 4 * q, 4);
            }
            sum_hi += i32x16_reduce_add(qh);
            sum_lo += i32x16_reduce_add(ql);
        }
        steps[r] = amax > 0.0f ? step : 0.0f;
        offsets[2 * r] = WEIGHT_OFFSET * sum_hi;
        offsets[2 * r + 1] = WEIGHT_OFFSET * sum_lo;
    }
}

#ifdef __AVX512F__
SIMD_INLINE void tile_rows(const uint8_t *tile_blob, int quads, const int8_t *qx, const float *steps,
                           const int32_t *offsets, const float *scale, float *y, int n, const int ROWS) {
    __m512i acc_hi[MAX_ROWS], acc_lo[MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc_hi[r] = acc_lo[r] = _mm512_setzero_si512();
    const int8_t *hi = qx, *lo = qx + (size_t)ROWS * quads * 4;
    for (int q = 0; q < quads; q++) {
        _mm_prefetch((const char *)(tile_blob + (size_t)(q + PREFETCH_QUADS) * 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(tile_blob + (size_t)(q + PREFETCH_QUADS_L2) * 64), _MM_HINT_T1);
        const __m512i w = _mm512_loadu_si512((const void *)(tile_blob + (size_t)q * 64));
        for (int r = 0; r < ROWS; r++) {
            acc_hi[r] = dot4(acc_hi[r], w, hi + ((size_t)q * ROWS + r) * 4);
            acc_lo[r] = dot4(acc_lo[r], w, lo + ((size_t)q * ROWS + r) * 4);
        }
    }
    /* |sum| <= k * 255 * 127 per pass: int32 holds it for k up to 66000; the two passes meet in float. */
    const __m512 s = _mm512_loadu_ps(scale);
    for (int r = 0; r < ROWS; r++) {
        const __m512 whole = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc_hi[r], _mm512_set1_epi32(offsets[2 * r])));
        const __m512 fine = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc_lo[r], _mm512_set1_epi32(offsets[2 * r + 1])));
        const __m512 sum = _mm512_fmadd_ps(fine, _mm512_set1_ps(1.0f / 256.0f), whole);
        _mm512_storeu_ps(y + (size_t)r * n, _mm512_mul_ps(sum, _mm512_mul_ps(s, _mm512_set1_ps(steps[r]))));
    }
}
#else
/* The AVX2 build's tile, one 8-output half at a time (ROWS rows' int32 sums, hi and lo, in 16 ymm
 * registers). VPMADDUBSW's unsigned operand cannot take the stored weights (up to 255: a pair of
 * products would saturate int16), so they go back to signed (xor 128) and the sign moves to the
 * activations: |w| * (x signed by w), at most 128 * 127 a product, 32512 a pair. VPMADDWD by 1 then
 * adds the pairs into int32: sum(w * x), the VNNI build's sums without their offset (WEIGHT_OFFSET
 * 0), followed by the same float operations per lane. */
SIMD_INLINE void tile_rows(const uint8_t *tile_blob, int quads, const int8_t *qx, const float *steps,
                           const int32_t *offsets, const float *scale, float *y, int n, const int ROWS) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const int8_t *hi = qx, *lo = qx + (size_t)ROWS * quads * 4;
    for (int half = 0; half < 2; half++) {
        __m256i acc_hi[MAX_ROWS], acc_lo[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) acc_hi[r] = acc_lo[r] = _mm256_setzero_si256();
        for (int q = 0; q < quads; q++) {
            if (half == 0) { /* the second half finds the tile in L1 */
                _mm_prefetch((const char *)(tile_blob + (size_t)(q + PREFETCH_QUADS) * 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(tile_blob + (size_t)(q + PREFETCH_QUADS_L2) * 64), _MM_HINT_T1);
            }
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(tile_blob + (size_t)q * 64 + 32 * half)), flip);
            const __m256i w_abs = _mm256_abs_epi8(w);
            for (int r = 0; r < ROWS; r++) {
                const __m256i x_hi = _mm256_sign_epi8(broadcast4(hi + ((size_t)q * ROWS + r) * 4), w);
                const __m256i x_lo = _mm256_sign_epi8(broadcast4(lo + ((size_t)q * ROWS + r) * 4), w);
                acc_hi[r] = _mm256_add_epi32(acc_hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_hi), ones));
                acc_lo[r] = _mm256_add_epi32(acc_lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_lo), ones));
            }
        }
        const __m256 s = _mm256_loadu_ps(scale + 8 * half);
        for (int r = 0; r < ROWS; r++) {
            const __m256 whole = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc_hi[r], _mm256_set1_epi32(offsets[2 * r])));
            const __m256 fine = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc_lo[r], _mm256_set1_epi32(offsets[2 * r + 1])));
            const __m256 sum = _mm256_fmadd_ps(fine, _mm256_set1_ps(1.0f / 256.0f), whole);
            _mm256_storeu_ps(y + (size_t)r * n + 8 * half, _mm256_mul_ps(sum, _mm256_mul_ps(s, _mm256_set1_ps(steps[r]))));
        }
    }
}
#endif

/* y[rows, n] = x[rows, k] @ W[k, n], W's output channel j scaled by scale[j]; k a multiple of 16 (at
 * most 66000), n of 16. Returns 0, or -1 when out of memory. */
int q8_matmul(const float *x, int rows, int k, const uint8_t *blob, const float *scale, int n, float *y) {
    const int quads = k / 4;
    const int tiles = n / TILE;
    int8_t *qx = (int8_t *)malloc((size_t)rows * k * 2);
    float *steps = (float *)malloc(sizeof(float) * (size_t)rows);
    int32_t *offsets = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)rows);
    if (!qx || !steps || !offsets) {
        free(qx);
        free(steps);
        free(offsets);
        return -1;
    }
    quantize_rows(x, rows, k, qx, steps, offsets);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        const uint8_t *tile_blob = blob + (size_t)t * quads * 64;
        for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
            const int8_t *q = qx + (size_t)2 * r0 * k;
            const float *st = steps + r0;
            const int32_t *off = offsets + 2 * r0;
            const float *sc = scale + (size_t)t * TILE;
            float *out = y + (size_t)r0 * n + (size_t)t * TILE;
#define TILE_ROWS(ROWS) tile_rows(tile_blob, quads, q, st, off, sc, out, n, ROWS)
            switch (rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS) {
            case 1: TILE_ROWS(1); break;
            case 2: TILE_ROWS(2); break;
#if MAX_ROWS == 8
            case 3: TILE_ROWS(3); break;
            case 4: TILE_ROWS(4); break;
            case 5: TILE_ROWS(5); break;
            case 6: TILE_ROWS(6); break;
            case 7: TILE_ROWS(7); break;
#endif
            default: TILE_ROWS(MAX_ROWS); break;
            }
#undef TILE_ROWS
        }
    }
    free(qx);
    free(steps);
    free(offsets);
    return 0;
}
