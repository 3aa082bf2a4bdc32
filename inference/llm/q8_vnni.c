/* y = x @ W for W in symmetric per-output-channel int8 (the output head), on AVX512-VNNI. Built with
 * the engine's other kernels into one library by cpu_kernels.py.
 *
 * Each row of x is written as step * (hi + lo / 256) over the whole row: hi = round(x / step) with
 * step = max|x| / 127, lo the rounding error in 1/256 of a step (clamped to +-127), both int8. The
 * weights are stored offset by 128 (VPDPBUSD multiplies unsigned by signed bytes), and the offset's
 * share, 128 * sum(hi) and 128 * sum(lo), is taken off the int32 sums. A tile of 16 outputs loads each
 * 64 bytes of its weights once for all the rows of a block and both passes: 2 * rows independent
 * VPDPBUSD chains. oneDNN's int8 GEMM (the rows of both passes stacked) took 1.0 ms more for 8 rows
 * than for 1 over this 49152 x 576 head; its weight bytes (28 MB) bound one row either way.
 * Whole numbers add up exactly, so a row's result does not depend on the batch.
 *
 * The weight blob: for each tile of 16 outputs, for each quad of 4 inputs, 64 bytes: byte 4*j + i is
 * output j's input 4*quad + i, plus 128.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define TILE 16
#define MAX_ROWS 8
/* Weights are read once a step, from memory: fetched this far ahead (4 KB) into L1, the 8-row head
 * took 1.5 instead of 2.2 ms a step in the engine's forward, 1 row 1.0 instead of 1.2 ms; into L2
 * from PREFETCH_QUADS_L2 ahead (8 KB) as well, 8 rows 1.05 instead of 1.17 ms (alternated). */
#define PREFETCH_QUADS 64
#define PREFETCH_QUADS_L2 128

/* Rows in blocks of MAX_ROWS (the last may be shorter, n rows): for block row r0, at qx + 2 * r0 * k,
 * quad by quad the n rows' 4 hi bytes, then likewise the lo bytes; per row its step and the offset
 * corrections 128 * sum(hi), 128 * sum(lo). */
static void quantize_rows(const float *x, int rows, int k, int8_t *qx, float *steps, int32_t *offsets) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int r = 0; r < rows; r++) {
        const int r0 = r - r % MAX_ROWS;
        const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
        const float *row = x + (size_t)r * k;
        __m512 top = _mm512_setzero_ps();
        for (int i = 0; i < k; i += 16) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_loadu_ps(row + i)));
        const float amax = _mm512_reduce_max_ps(top);
        const float step = amax > 0.0f ? amax / 127.0f : 1.0f;
        const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        const __m512 inv_fine = _mm512_set1_ps(amax > 0.0f ? 256.0f * 127.0f / amax : 0.0f);
        int8_t *hi = qx + (size_t)2 * r0 * k + (size_t)(r - r0) * 4;
        int8_t *lo = hi + (size_t)n * k;
        int32_t sum_hi = 0, sum_lo = 0;
        for (int i = 0; i < k; i += 16) {
            __m512i qh, ql;
            split_hi_lo(_mm512_loadu_ps(row + i), step, inv, inv_fine, &qh, &ql);
            int8_t h8[16], l8[16];
            _mm_storeu_si128((__m128i *)h8, _mm512_cvtsepi32_epi8(qh));
            _mm_storeu_si128((__m128i *)l8, _mm512_cvtsepi32_epi8(ql));
            for (int q = 0; q < 4; q++) { /* input quad i/4 + q of this row, among the block's rows */
                memcpy(hi + ((size_t)(i / 4 + q) * n) * 4, h8 + 4 * q, 4);
                memcpy(lo + ((size_t)(i / 4 + q) * n) * 4, l8 + 4 * q, 4);
            }
            sum_hi += _mm512_reduce_add_epi32(qh);
            sum_lo += _mm512_reduce_add_epi32(ql);
        }
        steps[r] = amax > 0.0f ? step : 0.0f;
        offsets[2 * r] = 128 * sum_hi;
        offsets[2 * r + 1] = 128 * sum_lo;
    }
}

static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile_blob, int quads, const int8_t *qx, const float *steps, const int32_t *offsets,
    const float *scale, float *y, int n, const int ROWS) {
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

/* y[rows, n] = x[rows, k] @ W[k, n], W's output channel j scaled by scale[j]; k a multiple of 16 (at
 * most 66000), n of 16. Returns 0, or -1 when out of memory. */
int q8_vnni_matmul(const float *x, int rows, int k, const uint8_t *blob, const float *scale, int n, float *y) {
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
            switch (rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS) {
            case 1: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 1); break;
            case 2: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 2); break;
            case 3: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 3); break;
            case 4: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 4); break;
            case 5: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 5); break;
            case 6: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 6); break;
            case 7: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 7); break;
            default: tile_rows(tile_blob, quads, q, st, off, sc, out, n, 8); break;
            }
        }
    }
    free(qx);
    free(steps);
    free(offsets);
    return 0;
}
