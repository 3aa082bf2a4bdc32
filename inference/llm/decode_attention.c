/* Attention of a step's rows (decoding tokens, and the tokens of prompt chunks) over their own slot of
 * the KV pool, in float32 arithmetic, on AVX512F. Built with the engine's other kernels into one
 * library by cpu_kernels.py.
 *
 * torch's flash attention for CPU cost 40 us a layer for one decoding row and 150 us for eight at 100
 * tokens of context: its blocking is made for long queries, and a batch of slots of different lengths
 * needs a padded, masked call. Here every row's new key and value are stored first; then each (row,
 * head) pair is one work item: it scores the query against its slot's keys 0..pos (a prompt row thus
 * sees the rows of its chunk before it), takes an exact softmax and sums the values. An item reads
 * only its own row's data, always in the same order, so a row's output never depends on the other
 * rows of the step.
 *
 * The pool layer: [2, slots, kv_heads, capacity, dim] (keys, then values), float32 or float16 (half
 * the memory; widened to float32 as it is loaded). qkv: per row, `heads`
 * rotated queries, then `kv_heads` rotated keys, then `kv_heads` values, each `dim` floats, rows
 * `row_stride` floats apart. out: [rows, heads * dim].
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define MAX_CHUNKS 16 /* head dims up to 256 */

/* 16 floats of K or V at element `at`: float32, or float16 (HALF) widened. */
static inline __attribute__((always_inline)) __m512 load_kv(const void *kv, size_t at, const int HALF) {
    if (HALF) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)kv + at)));
    return _mm512_loadu_ps((const float *)kv + at);
}

/* One query head over `len` positions. CHUNKS (dim / 16, at most MAX_CHUNKS) and HALF are constants
 * where inlined, so the accumulators stay in registers; keys are scored four at a time and values
 * summed two at a time, to keep independent FMAs in flight. */
static inline __attribute__((always_inline)) void attend(
    const float *q, const void *k, const void *v, int len, float scale, float *scores, float *out,
    const int CHUNKS, const int HALF) {
    const size_t dim = 16 * CHUNKS;
    __m512 query[MAX_CHUNKS];
    for (int c = 0; c < CHUNKS; c++) query[c] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * c), _mm512_set1_ps(scale));
    int t = 0;
    for (; t + 4 <= len; t += 4) {
        const size_t at = (size_t)t * dim;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < CHUNKS; c++) {
            a0 = _mm512_fmadd_ps(query[c], load_kv(k, at + 16 * c, HALF), a0);
            a1 = _mm512_fmadd_ps(query[c], load_kv(k, at + dim + 16 * c, HALF), a1);
            a2 = _mm512_fmadd_ps(query[c], load_kv(k, at + 2 * dim + 16 * c, HALF), a2);
            a3 = _mm512_fmadd_ps(query[c], load_kv(k, at + 3 * dim + 16 * c, HALF), a3);
        }
        scores[t] = _mm512_reduce_add_ps(a0);
        scores[t + 1] = _mm512_reduce_add_ps(a1);
        scores[t + 2] = _mm512_reduce_add_ps(a2);
        scores[t + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; t < len; t++) {
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < CHUNKS; c++) a = _mm512_fmadd_ps(query[c], load_kv(k, (size_t)t * dim + 16 * c, HALF), a);
        scores[t] = _mm512_reduce_add_ps(a);
    }
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (t = 0; t + 16 <= len; t += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(scores + t));
    const __mmask16 tail = (__mmask16)((1u << (len - t)) - 1u);
    if (t < len) top = _mm512_mask_max_ps(top, tail, top, _mm512_maskz_loadu_ps(tail, scores + t));
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 total = _mm512_setzero_ps();
    for (t = 0; t + 16 <= len; t += 16) {
        const __m512 w = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + t), shift));
        _mm512_storeu_ps(scores + t, w);
        total = _mm512_add_ps(total, w);
    }
    if (t < len) {
        const __m512 w = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + t), shift));
        _mm512_mask_storeu_ps(scores + t, tail, w);
        total = _mm512_add_ps(total, _mm512_maskz_mov_ps(tail, w));
    }
    __m512 even[MAX_CHUNKS], odd[MAX_CHUNKS];
    for (int c = 0; c < CHUNKS; c++) even[c] = odd[c] = _mm512_setzero_ps();
    for (t = 0; t + 2 <= len; t += 2) {
        const __m512 w0 = _mm512_set1_ps(scores[t]), w1 = _mm512_set1_ps(scores[t + 1]);
        const size_t at = (size_t)t * dim;
        for (int c = 0; c < CHUNKS; c++) {
            even[c] = _mm512_fmadd_ps(w0, load_kv(v, at + 16 * c, HALF), even[c]);
            odd[c] = _mm512_fmadd_ps(w1, load_kv(v, at + dim + 16 * c, HALF), odd[c]);
        }
    }
    if (t < len) {
        const __m512 w = _mm512_set1_ps(scores[t]);
        for (int c = 0; c < CHUNKS; c++) even[c] = _mm512_fmadd_ps(w, load_kv(v, (size_t)t * dim + 16 * c, HALF), even[c]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
    for (int c = 0; c < CHUNKS; c++) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(_mm512_add_ps(even[c], odd[c]), inv));
}

/* Store dim floats at element `at` of kv, as float32 or float16 (rounded to nearest). */
static void store_kv(void *kv, size_t at, const float *from, int dim, int half) {
    if (!half) {
        memcpy((float *)kv + at, from, sizeof(float) * dim);
        return;
    }
    for (int i = 0; i < dim; i += 16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)kv + at + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* layer holds float16 when half, else float32. Returns 0; -1 if dim is not a multiple of 16 up to
 * 256; -2 when out of memory. */
int decode_attention(const float *qkv, int rows, int row_stride, int heads, int kv_heads, int dim,
                     void *layer, int half, int slots, int capacity, const int64_t *slot, const int64_t *pos,
                     float scale, float *out) {
    if (dim % 16 != 0 || dim > 16 * MAX_CHUNKS) return -1;
    const size_t head_size = (size_t)capacity * dim;
    const size_t values = (size_t)slots * kv_heads * head_size;
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < kv_heads; h++) {
            const size_t at = ((size_t)slot[r] * kv_heads + h) * head_size + (size_t)pos[r] * dim;
            const float *fresh = qkv + (size_t)r * row_stride + (size_t)(heads + h) * dim;
            store_kv(layer, at, fresh, dim, half);
            store_kv(layer, at + values, fresh + (size_t)kv_heads * dim, dim, half);
        }
    }
    int longest = 0;
    for (int r = 0; r < rows; r++) longest = pos[r] + 1 > longest ? (int)pos[r] + 1 : longest;
    const int group = heads / kv_heads;
    const size_t item_size = half ? 2 : 4;
    int failed = 0;
#pragma omp parallel
    {
        float *scores = (float *)malloc(sizeof(float) * ((size_t)longest + 16));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        /* A thread takes a row's query heads that share a KV head together (their keys and values
         * stay in its cache), and the next such group when it is done (a prompt's later rows have
         * more to read). Dealing out single heads cost 8 decoding rows 10% more. */
#pragma omp for schedule(dynamic, group)
        for (int item = 0; item < rows * heads; item++) {
            if (!scores) continue;
            const int r = item / heads, h = item % heads;
            const char *k = (const char *)layer + ((size_t)slot[r] * kv_heads + h / group) * head_size * item_size;
            const char *v = k + values * item_size;
            const float *q = qkv + (size_t)r * row_stride + (size_t)h * dim;
            float *o = out + ((size_t)r * heads + h) * dim;
            const int len = (int)pos[r] + 1;
            if (half && dim == 64) attend(q, k, v, len, scale, scores, o, 4, 1);
            else if (half && dim == 128) attend(q, k, v, len, scale, scores, o, 8, 1);
            else if (half) attend(q, k, v, len, scale, scores, o, dim / 16, 1);
            else if (dim == 64) attend(q, k, v, len, scale, scores, o, 4, 0);
            else if (dim == 128) attend(q, k, v, len, scale, scores, o, 8, 0);
            else attend(q, k, v, len, scale, scores, o, dim / 16, 0);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
