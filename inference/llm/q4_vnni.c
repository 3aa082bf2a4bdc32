/* y = x @ W for W in 4-bit groups of 32 (Q4_1: w = q * d + m, q in 0..15), on AVX512-VNNI.
 *
 * Built with decode_attention.c into one library by cpu_kernels.py (gcc, at first use). Each row of
 * x is written per group of 32 as u * qx, with qx = 254 * hi + lo a 15-bit whole number held as two
 * int8 (quantize_rows). The products of 4-bit weights and 8-bit activations add up in int32 with
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 32
#define TILE 16
#define BLOCK_BYTES 320
#define MAX_ROWS 8

/* Row r of x in two int8 passes per group of 32: hi = round(x / s) with s = max|x| / 127, then the
 * rounding error lo = round((x - hi * s) / (s / 254)), so that x = u * (254 * hi + lo) with u = s / 254,
 * to 15 bits. One 8-bit pass alone (llama.cpp's Q8_1 for Q4_1) doubled the model's divergence from
 * float32, and its greedy answer to "What is the capital of France?" turned French. Also stored per
 * group: u, and u times the sum of 254 * hi + lo (the m term).
 *
 * Laid out by blocks of MAX_ROWS rows (the last may be shorter, `n` rows), group by group: for block
 * row r0 and group g, at qx + 2 * r0 * k + g * 2 * n * 32, the n rows' 32 hi bytes, then their 32 lo
 * bytes; at factors + 2 * r0 * groups + g * 2 * n, the n rows' u, then their m-term factors. So the
 * multiplying loop reaches every row of its block from one pointer, with constant offsets. */
static void quantize_rows(const float *x, int rows, int k, int8_t *qx, float *factors) {
    const int groups = k / GROUP;
    /* A prompt chunk's rows are many: quantize them on every thread too. */
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int r = 0; r < rows; r++) {
        const int r0 = r - r % MAX_ROWS;
        const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
        for (int g = 0; g < groups; g++) {
            const float *xg = x + (size_t)r * k + (size_t)g * GROUP;
            int8_t *hi = qx + (size_t)2 * r0 * k + (size_t)g * 2 * n * GROUP + (size_t)(r - r0) * GROUP;
            int8_t *lo = hi + (size_t)n * GROUP;
            float *f = factors + (size_t)2 * r0 * groups + (size_t)g * 2 * n + (r - r0);
            int total = 0;
            __m512 v[2] = {_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16)};
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
            const float s = amax / 127.0f;
            const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            const __m512 inv_fine = _mm512_set1_ps(amax > 0.0f ? 254.0f * 127.0f / amax : 0.0f);
            for (int h = 0; h < 2; h++) {
                __m512i qh = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inv)); /* round to nearest even */
                __m512 rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qh), _mm512_set1_ps(s), v[h]);
                __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(rest, inv_fine));
                ql = _mm512_max_epi32(_mm512_min_epi32(ql, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                _mm_storeu_si128((__m128i *)(hi + 16 * h), _mm512_cvtsepi32_epi8(qh));
                _mm_storeu_si128((__m128i *)(lo + 16 * h), _mm512_cvtsepi32_epi8(ql));
                total += 254 * _mm512_reduce_add_epi32(qh) + _mm512_reduce_add_epi32(ql);
            }
            f[0] = s / 254.0f;
            f[n] = s / 254.0f * (float)total;
        }
    }
}

/* acc += w (16 lanes of 4 unsigned bytes) . the 4 signed bytes at p, broadcast to every lane. Written
 * out so that the broadcast is VPDPBUSD's own memory operand: gcc loads it with a separate
 * VPBROADCASTD, and with that extra instruction per product 8 rows took 6-18% longer. */
static inline __m512i dot4(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %[p]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [p] "m"(*(const int32_t *)p));
    return acc;
}

/* One tile of 16 outputs for a block of ROWS (1..MAX_ROWS) rows; inlined with a constant ROWS so
 * that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile_blob, int groups, const int8_t *qx, const float *factors, float *y, int n,
    const int ROWS) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    const __m512i times254 = _mm512_set1_epi32(254);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *blk = tile_blob + (size_t)g * BLOCK_BYTES;
        const int8_t *hi = qx + (size_t)g * 2 * ROWS * GROUP;
        const int8_t *lo = hi + ROWS * GROUP;
        const float *f = factors + (size_t)g * 2 * ROWS;
        __m512i wq[8];
        for (int c = 0; c < 4; c++) {
            __m512i packed = _mm512_loadu_si512((const void *)(blk + 64 * c));
            wq[2 * c] = _mm512_and_si512(packed, low_nibbles);
            wq[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        /* |254 * dot_hi + dot_lo| <= 255 * 32 * 15 * 127: no int32 overflow. The rows are interleaved,
         * so that independent VPDPBUSD chains are in flight (one chain alone waits on each
         * instruction's latency). Few rows keep hi and lo apart, for twice the chains; more rows run
         * the hi pass, scale it by 254 and add the lo pass to the same sum, to fit the registers. */
        __m512i dot[MAX_ROWS];
        if (ROWS <= 2) {
            __m512i dot_lo[2];
            for (int r = 0; r < ROWS; r++) dot[r] = dot_lo[r] = _mm512_setzero_si512();
            for (int quad = 0; quad < 8; quad++) {
                for (int r = 0; r < ROWS; r++) {
                    dot[r] = dot4(dot[r], wq[quad], hi + r * GROUP + 4 * quad);
                    dot_lo[r] = dot4(dot_lo[r], wq[quad], lo + r * GROUP + 4 * quad);
                }
            }
            for (int r = 0; r < ROWS; r++) dot[r] = _mm512_add_epi32(_mm512_mullo_epi32(dot[r], times254), dot_lo[r]);
        } else {
            for (int r = 0; r < ROWS; r++) dot[r] = _mm512_setzero_si512();
            for (int quad = 0; quad < 8; quad++)
                for (int r = 0; r < ROWS; r++)
                    dot[r] = dot4(dot[r], wq[quad], hi + r * GROUP + 4 * quad);
            for (int r = 0; r < ROWS; r++) dot[r] = _mm512_mullo_epi32(dot[r], times254);
            for (int quad = 0; quad < 8; quad++)
                for (int r = 0; r < ROWS; r++)
                    dot[r] = dot4(dot[r], wq[quad], lo + r * GROUP + 4 * quad);
        }
        for (int r = 0; r < ROWS; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, _mm512_set1_ps(f[r])), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(f[ROWS + r]), acc[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) _mm512_storeu_ps(y + (size_t)r * n, acc[r]);
}

/* y[rows, n] = x[rows, k] @ W[k, n]; k a multiple of 32, n of 16. Returns 0, or -1 when out of memory. */
int q4_vnni_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y) {
    const int groups = k / GROUP;
    const int tiles = n / TILE;
    int8_t *qx = (int8_t *)malloc((size_t)rows * k * 2);
    float *factors = (float *)malloc(sizeof(float) * (size_t)rows * groups * 2);
    if (!qx || !factors) {
        free(qx);
        free(factors);
        return -1;
    }
    quantize_rows(x, rows, k, qx, factors);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        const uint8_t *tile_blob = blob + (size_t)t * groups * BLOCK_BYTES;
        for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
            const int8_t *q = qx + (size_t)2 * r0 * k;
            const float *f = factors + (size_t)2 * r0 * groups;
            float *out = y + (size_t)r0 * n + (size_t)t * TILE;
            switch (rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS) {
            case 1: tile_rows(tile_blob, groups, q, f, out, n, 1); break;
            case 2: tile_rows(tile_blob, groups, q, f, out, n, 2); break;
            case 3: tile_rows(tile_blob, groups, q, f, out, n, 3); break;
            case 4: tile_rows(tile_blob, groups, q, f, out, n, 4); break;
            case 5: tile_rows(tile_blob, groups, q, f, out, n, 5); break;
            case 6: tile_rows(tile_blob, groups, q, f, out, n, 6); break;
            case 7: tile_rows(tile_blob, groups, q, f, out, n, 7); break;
            default: tile_rows(tile_blob, groups, q, f, out, n, 8); break;
            }
        }
    }
    free(qx);
    free(factors);
    return 0;
}
