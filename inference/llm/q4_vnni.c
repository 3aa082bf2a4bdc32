/* y = x @ W for W in 4-bit groups of 32 (Q4_1: w = q * d + m, q in 0..15), on AVX512-VNNI.
 *
 * Built with decode_attention.c into one library by cpu_kernels.py (gcc, at first use). Each row of
 * x is written per group of 32 as u * qx, with qx = 256 * hi + lo a 15-bit whole number held as two
 * int8 (quantize_group). The products of 4-bit weights and 8-bit activations add up in int32 with
 * VPDPBUSD, 64 at a time, once for hi and once for lo; the group's sum is then scaled in float:
 *     y[r, n] += d[n, g] * u[r, g] * dot(q[n, g], qx[r, g]) + m[n, g] * u[r, g] * sum(qx[r, g])
 * Lanes run over 16 outputs; each 32-bit lane takes 4 consecutive inputs. Every row goes through the
 * same instructions whatever the other rows are, and whole numbers add up exactly, so a row's result
 * does not depend on the batch.
 *
 * The weight blob: for each tile of 16 outputs, for each group of 32 inputs, 320 bytes:
 *   256 bytes of 4-bit q: 4 chunks of 64 bytes; chunk c holds input quads 2c (low nibbles) and
 *       2c+1 (high nibbles), byte 4*j + i being output j's input 4*quad + i;
 *   16 float16 d, then 16 float16 m (the tile's outputs).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define GROUP 32
#define TILE 16
#define BLOCK_BYTES 320
#define MAX_ROWS 8
/* Weights are read once a step, from memory: fetched this many groups ahead (2.5 KB) into L1, the
 * 8-row step's GEMMs took 6.4 instead of 8.5 ms in the engine's forward (1 row: 4.0 instead of 4.3
 * ms); fetched into L2 from PREFETCH_GROUPS_L2 ahead (10 KB) as well, a 1-row step took 5.3 instead
 * of 5.6 ms (alternated in one process; 8 rows unchanged). */
#define PREFETCH_GROUPS 8
#define PREFETCH_GROUPS_L2 32

/* 1 / sqrt(mean(x^2) + eps) over row r (k floats): RMSNorm's factor. */
static float inverse_rms(const float *x, int r, int k, float eps) {
    const float *row = x + (size_t)r * k;
    __m512 squares = _mm512_setzero_ps();
    for (int i = 0; i < k; i += 16) {
        const __m512 v = _mm512_loadu_ps(row + i);
        squares = _mm512_fmadd_ps(v, v, squares);
    }
    return 1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)k + eps);
}

/* The 32 inputs of group g of row r, transformed, into v[0..1]: x itself; x * inv_rms * w (RMSNorm,
 * with norm_w); or with gated, silu(a) * b for a row [a | b] of 2k floats (a SwiGLU MLP's gate and
 * up projections). */
static inline void group_input(const float *x, int r, int k, int g, const float *norm_w, float inv_rms, int gated,
                               __m512 v[2]) {
    for (int h = 0; h < 2; h++) {
        const int i = g * GROUP + 16 * h;
        if (gated) {
            const float *a = x + (size_t)r * 2 * k + i;
            const __m512 gate = _mm512_loadu_ps(a);
            const __m512 one = _mm512_set1_ps(1.0f);
            const __m512 sigmoid = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gate))));
            v[h] = _mm512_mul_ps(_mm512_mul_ps(gate, sigmoid), _mm512_loadu_ps(a + k));
        } else if (norm_w) {
            const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(x + (size_t)r * k + i), _mm512_set1_ps(inv_rms));
            v[h] = _mm512_mul_ps(scaled, _mm512_loadu_ps(norm_w + i));
        } else {
            v[h] = _mm512_loadu_ps(x + (size_t)r * k + i);
        }
    }
}

/* Group g of row r (its 32 inputs in v) in two int8 passes (split_hi_lo) with the step s = max|x| / 127,
 * so that x = u * (256 * hi + lo) with u = s / 256, to 15 bits (256 rather than 254 makes the
 * combination a shift). One 8-bit pass
 * alone (llama.cpp's Q8_1 for Q4_1) doubled the model's divergence from float32 (KL 0.0018 -> 0.0042
 * over 1800 tokens), and its greedy answer to "What is the capital of France?" turned to French
 * nonsense; so did one pass for only the normalized inputs, or only the others. Also stored per
 * group: u, and u times the sum of 256 * hi + lo (the m term).
 *
 * Laid out by blocks of MAX_ROWS rows (the last may be shorter, `n` rows), group by group: for block
 * row r0 and group g, at qx + 2 * r0 * k + g * 2 * n * 32, the n rows' 32 hi bytes, then their 32 lo
 * bytes; at factors + 2 * r0 * groups + g * 2 * n, the n rows' u, then their m-term factors. So the
 * multiplying loop reaches every row of its block from one pointer, with constant offsets. */
static inline void quantize_group(const __m512 v[2], int rows, int r, int k, int g, int8_t *qx, float *factors) {
    const int groups = k / GROUP;
    const int r0 = r - r % MAX_ROWS;
    const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
    int8_t *hi = qx + (size_t)2 * r0 * k + (size_t)g * 2 * n * GROUP + (size_t)(r - r0) * GROUP;
    int8_t *lo = hi + (size_t)n * GROUP;
    float *f = factors + (size_t)2 * r0 * groups + (size_t)g * 2 * n + (r - r0);
    int total = 0;
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float s = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512 inv_fine = _mm512_set1_ps(amax > 0.0f ? 256.0f * 127.0f / amax : 0.0f);
    for (int h = 0; h < 2; h++) {
        __m512i qh, ql;
        split_hi_lo(v[h], s, inv, inv_fine, &qh, &ql);
        _mm_storeu_si128((__m128i *)(hi + 16 * h), _mm512_cvtsepi32_epi8(qh));
        _mm_storeu_si128((__m128i *)(lo + 16 * h), _mm512_cvtsepi32_epi8(ql));
        total += 256 * _mm512_reduce_add_epi32(qh) + _mm512_reduce_add_epi32(ql);
    }
    f[0] = s / 256.0f;
    f[n] = s / 256.0f * (float)total;
}

/* One tile of 16 outputs for a block of ROWS (1..MAX_ROWS) rows; inlined with a constant ROWS so
 * that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile_blob, int groups, const int8_t *qx, const float *factors, float *y, int n,
    int accumulate, const int ROWS) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *blk = tile_blob + (size_t)g * BLOCK_BYTES;
        for (int line = 0; line < BLOCK_BYTES; line += 64) {
            _mm_prefetch((const char *)(blk + PREFETCH_GROUPS * BLOCK_BYTES + line), _MM_HINT_T0);
            _mm_prefetch((const char *)(blk + PREFETCH_GROUPS_L2 * BLOCK_BYTES + line), _MM_HINT_T1);
        }
        const int8_t *hi = qx + (size_t)g * 2 * ROWS * GROUP;
        const int8_t *lo = hi + ROWS * GROUP;
        const float *f = factors + (size_t)g * 2 * ROWS;
        /* Quad pair by quad pair (one 64-byte chunk of weights), each row's hi and lo sums advance
         * side by side: 2 * ROWS independent VPDPBUSD chains in flight (a chain alone waits on each
         * instruction's latency), and only the chunk's weights held in registers. */
        __m512i dot[MAX_ROWS], dot_lo[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) dot[r] = dot_lo[r] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m512i packed = _mm512_loadu_si512((const void *)(blk + 64 * c));
            const __m512i w_even = _mm512_and_si512(packed, low_nibbles);
            const __m512i w_odd = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
            for (int r = 0; r < ROWS; r++) {
                dot[r] = dot4(dot[r], w_even, hi + r * GROUP + 8 * c);
                dot_lo[r] = dot4(dot_lo[r], w_even, lo + r * GROUP + 8 * c);
            }
            for (int r = 0; r < ROWS; r++) {
                dot[r] = dot4(dot[r], w_odd, hi + r * GROUP + 8 * c + 4);
                dot_lo[r] = dot4(dot_lo[r], w_odd, lo + r * GROUP + 8 * c + 4);
            }
        }
        /* |256 * dot_hi + dot_lo| <= 257 * 32 * 15 * 127: no int32 overflow. */
        for (int r = 0; r < ROWS; r++) dot[r] = _mm512_add_epi32(_mm512_slli_epi32(dot[r], 8), dot_lo[r]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        for (int r = 0; r < ROWS; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, _mm512_set1_ps(f[r])), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(f[ROWS + r]), acc[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float *out = y + (size_t)r * n;
        _mm512_storeu_ps(out, accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), acc[r]) : acc[r]);
    }
}

/* y[rows, n] = in(x)[rows, k] @ W[k, n], or y += that when accumulate (a residual add); k a multiple
 * of 32, n of 16. in(x) is x itself, or with norm_w, RMSNorm(x) with that weight and eps; with gated,
 * silu(x[:, :k]) * x[:, k:] for an x of 2k columns. Fusing these here saves the step torch's own
 * calls for them: about 15 us for each of a layer's two norms and 10-20 us for its gating.
 * Returns 0, or -1 when out of memory. */
int q4_vnni_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
                   const float *norm_w, float eps, int gated, int accumulate) {
    const int groups = k / GROUP;
    const int tiles = n / TILE;
    int8_t *qx = (int8_t *)malloc((size_t)rows * k * 2);
    float *factors = (float *)malloc(sizeof(float) * (size_t)rows * groups * 2);
    float *inv_rms = norm_w ? (float *)malloc(sizeof(float) * (size_t)rows) : NULL;
    if (!qx || !factors || (norm_w && !inv_rms)) {
        free(qx);
        free(factors);
        free(inv_rms);
        return -1;
    }
    /* One parallel region: the rows are transformed and quantized group by group on every thread
     * (on the calling thread alone, that had cost 8 rows 0.6 ms a step while the other waited), then
     * the tiles are dealt out. */
#pragma omp parallel
    {
        if (norm_w) {
#pragma omp for schedule(static)
            for (int r = 0; r < rows; r++) inv_rms[r] = inverse_rms(x, r, k, eps);
        }
        /* Group-major, so that a thread writes all the rows of a group (their bytes and factors
         * share cache lines). */
#pragma omp for schedule(static)
        for (int item = 0; item < rows * groups; item++) {
            const int g = item / rows, r = item % rows;
            __m512 v[2];
            group_input(x, r, k, g, norm_w, norm_w ? inv_rms[r] : 0.0f, gated, v);
            quantize_group(v, rows, r, k, g, qx, factors);
        }
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *tile_blob = blob + (size_t)t * groups * BLOCK_BYTES;
            for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
                const int8_t *q = qx + (size_t)2 * r0 * k;
                const float *f = factors + (size_t)2 * r0 * groups;
                float *out = y + (size_t)r0 * n + (size_t)t * TILE;
                switch (rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS) {
                case 1: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 1); break;
                case 2: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 2); break;
                case 3: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 3); break;
                case 4: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 4); break;
                case 5: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 5); break;
                case 6: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 6); break;
                case 7: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 7); break;
                default: tile_rows(tile_blob, groups, q, f, out, n, accumulate, 8); break;
                }
            }
        }
    }
    free(qx);
    free(factors);
    free(inv_rms);
    return 0;
}
