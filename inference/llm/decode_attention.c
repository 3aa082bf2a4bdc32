/* Attention of a step's rows (decoding tokens, and the tokens of prompt chunks) over their own slot of
 * the KV pool, in float32 arithmetic, on AVX512F. Built with the engine's other kernels into one
 * library by cpu_kernels.py.
 *
 * torch's flash attention for CPU cost 40 us a layer for one decoding row and 150 us for eight at 100
 * tokens of context: its blocking is made for long queries, and a batch of slots of different lengths
 * needs a padded, masked call. Here every row's queries and keys are first rotated (RoPE) and its new
 * key and value stored; then each (row, KV head) pair is one work item: it scores the query heads
 * that share that KV head against the slot's keys 0..pos (a prompt row thus sees the rows of its chunk
 * before it), takes an exact softmax per head and sums the values. An item reads only its own row's
 * data, always in the same order, so a row's output never depends on the other rows of the step.
 *
 * The pool layer: [2, slots, kv_heads, capacity, dim] (keys, then values), float32 or float16 (half
 * the memory; widened to float32 as it is loaded). qkv: per row, `heads` queries, then `kv_heads`
 * keys, then `kv_heads` values, each `dim` floats, rows `row_stride` floats apart. out: [rows, heads *
 * dim].
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define MAX_CHUNKS 16 /* head dims up to 256 */
#define MAX_HEADS 3   /* query heads taken together */
#define MAX_HELD 12   /* registers for their queries (HEADS * CHUNKS) */
#define PREFETCH_KEYS 8

/* 16 floats of K or V at element `at`: float32, or float16 (HALF) widened. */
static inline __attribute__((always_inline)) __m512 load_kv(const void *kv, size_t at, const int HALF) {
    if (HALF) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)kv + at)));
    return _mm512_loadu_ps((const float *)kv + at);
}

/* Lane j of the result: the sum of v[j]'s 16 lanes. A transposing tree of 45 shuffles and adds for
 * the 16 sums, against about 8 dependent instructions for each one alone (_mm512_reduce_add_ps). */
static inline __attribute__((always_inline)) __m512 sum_lanes16(const __m512 *v) {
    __m512 pairs[8], quads[4], octs[2];
    for (int i = 0; i < 8; i++) /* per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] for v[2i], v[2i+1] */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per block: the block's sum for each of 4 vectors */
        const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; i++) /* blocks 0+1 and 2+3, for 8 vectors */
        octs[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(octs[0], octs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(octs[0], octs[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* HEADS query heads that share one KV head (consecutive in q and out, `dim` floats apart) over `len`
 * positions. Each key is loaded (and widened) once for all of them. CHUNKS (dim / 16), HALF and HEADS
 * are constants where inlined, so that the queries, a key and the value sums stay in registers
 * (HEADS * CHUNKS <= MAX_HELD). `scores` holds HEADS rows of `stride` floats (len rounded up to 16). */
static inline __attribute__((always_inline)) void attend(
    const float *q, const void *k, const void *v, int len, float scale, float *scores, int stride, float *out,
    const int CHUNKS, const int HALF, const int HEADS) {
    const size_t dim = 16 * CHUNKS;
    __m512 query[MAX_HEADS][MAX_CHUNKS];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) query[h][c] = _mm512_mul_ps(_mm512_loadu_ps(q + h * dim + 16 * c), _mm512_set1_ps(scale));
    /* Scores 16 keys at a time: each key's per-lane products, then their lane sums together. The keys
     * are fetched PREFETCH_KEYS ahead and each position's value with its key: in a step the KV comes
     * from memory (the weights pass through the caches in between), and 8 rows' attention at 200
     * tokens took 2.5 instead of 3.2 ms a step (alternated in one process). */
    const size_t bytes = HALF ? 2 : 4; /* of an element */
    __m512 partial[MAX_HEADS][16];
    for (int t0 = 0; t0 < len; t0 += 16) {
        const int n = len - t0 < 16 ? len - t0 : 16;
        for (int j = 0; j < n; j++) {
            const size_t at = (size_t)(t0 + j) * dim;
            for (size_t line = 0; line < dim * bytes; line += 64) {
                _mm_prefetch((const char *)k + (at + PREFETCH_KEYS * dim) * bytes + line, _MM_HINT_T0);
                _mm_prefetch((const char *)v + at * bytes + line, _MM_HINT_T0);
            }
            __m512 key[MAX_CHUNKS];
            for (int c = 0; c < CHUNKS; c++) key[c] = load_kv(k, at + 16 * c, HALF);
            for (int h = 0; h < HEADS; h++) {
                __m512 a = _mm512_mul_ps(query[h][0], key[0]);
                for (int c = 1; c < CHUNKS; c++) a = _mm512_fmadd_ps(query[h][c], key[c], a);
                partial[h][j] = a;
            }
        }
        for (int h = 0; h < HEADS; h++) {
            for (int j = n; j < 16; j++) partial[h][j] = _mm512_setzero_ps();
            _mm512_storeu_ps(scores + h * stride + t0, sum_lanes16(partial[h]));
        }
    }
    /* An exact softmax per head. */
    const int whole = len & ~15;
    const __mmask16 tail = (__mmask16)((1u << (len - whole)) - 1u);
    float inverse[MAX_HEADS];
    for (int h = 0; h < HEADS; h++) {
        float *s = scores + h * stride;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int t = 0; t < whole; t += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + t));
        if (whole < len) top = _mm512_mask_max_ps(top, tail, top, _mm512_loadu_ps(s + whole));
        const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        __m512 total = _mm512_setzero_ps();
        for (int t = 0; t < whole; t += 16) {
            const __m512 w = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), shift));
            _mm512_storeu_ps(s + t, w);
            total = _mm512_add_ps(total, w);
        }
        if (whole < len) {
            const __m512 w = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + whole), shift)));
            _mm512_storeu_ps(s + whole, w);
            total = _mm512_add_ps(total, w);
        }
        inverse[h] = 1.0f / _mm512_reduce_add_ps(total);
    }
    /* The weighted values: each value loaded once for all heads, one accumulator per head and chunk. */
    __m512 sum[MAX_HEADS][MAX_CHUNKS];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) sum[h][c] = _mm512_setzero_ps();
    for (int t = 0; t < len; t++) {
        __m512 value[MAX_CHUNKS];
        for (int c = 0; c < CHUNKS; c++) value[c] = load_kv(v, (size_t)t * dim + 16 * c, HALF);
        for (int h = 0; h < HEADS; h++) {
            const __m512 w = _mm512_set1_ps(scores[h * stride + t]);
            for (int c = 0; c < CHUNKS; c++) sum[h][c] = _mm512_fmadd_ps(w, value[c], sum[h][c]);
        }
    }
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++)
            _mm512_storeu_ps(out + h * dim + 16 * c, _mm512_mul_ps(sum[h][c], _mm512_set1_ps(inverse[h])));
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

/* x (dim floats) rotated in place by its position's rotary embedding: x * cos + roll(x, dim / 2) * sin,
 * sin's first half negated (rotate_half), as the products and the sum torch's ops take (no FMA: the
 * kernels build as ISO C, which does not contract), so the rotation is bit for bit torch's. The roll is
 * two copies, not an index modulo dim per element (a division each: 94 prompt rows' rotation had cost
 * 77 us a layer, 2.3 ms a step). */
static void rotate(float *x, const float *cos, const float *sin, int dim) {
    float rolled[16 * MAX_CHUNKS];
    const int half = dim / 2;
    memcpy(rolled, x + half, sizeof(float) * (size_t)(dim - half));
    memcpy(rolled + (dim - half), x, sizeof(float) * (size_t)half);
    for (int i = 0; i < dim; i += 16)
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(cos + i)),
                                              _mm512_mul_ps(_mm512_loadu_ps(rolled + i), _mm512_loadu_ps(sin + i))));
}

/* layer holds float16 when half, else float32. With cos and sin (tables of `dim` floats for each of
 * rope_positions positions), each row's queries and keys are first rotated in place for its position;
 * without, they come rotated. Returns 0; -1 if dim is not a multiple of 16 up to 256; -2 when out of
 * memory; -3 for a position beyond the tables. */
int decode_attention(float *qkv, int rows, int row_stride, int heads, int kv_heads, int dim,
                     void *layer, int half, int slots, int capacity, const int64_t *slot, const int64_t *pos,
                     const float *cos, const float *sin, int rope_positions, float scale, float *out) {
    if (dim % 16 != 0 || dim > 16 * MAX_CHUNKS) return -1;
    for (int r = 0; cos && r < rows; r++)
        if (pos[r] < 0 || pos[r] >= rope_positions) return -3;
    const size_t head_size = (size_t)capacity * dim;
    const size_t values = (size_t)slots * kv_heads * head_size;
    int longest = 0;
    for (int r = 0; r < rows; r++) longest = pos[r] + 1 > longest ? (int)pos[r] + 1 : longest;
    const int stride = (longest + 15) & ~15;
    const int group = heads / kv_heads;
    const int chunks = dim / 16;
    /* Query heads of one KV head are taken together, as many as fit in registers. */
    int together = MAX_HELD / chunks;
    together = together < 1 ? 1 : together > MAX_HEADS ? MAX_HEADS : together;
    together = together > group ? group : together;
    const int parts = (group + together - 1) / together; /* items per (row, KV head) */
    const size_t item_size = half ? 2 : 4;
    int failed = 0;
#pragma omp parallel
    {
        /* Every row's new key and value are stored before any row attends: a prompt row sees the rows
         * of its chunk before it. */
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            float *row = qkv + (size_t)r * row_stride;
            if (cos)
                for (int h = 0; h < heads + kv_heads; h++)
                    rotate(row + (size_t)h * dim, cos + (size_t)pos[r] * dim, sin + (size_t)pos[r] * dim, dim);
            for (int h = 0; h < kv_heads; h++) {
                const size_t at = ((size_t)slot[r] * kv_heads + h) * head_size + (size_t)pos[r] * dim;
                const float *fresh = row + (size_t)(heads + h) * dim;
                store_kv(layer, at, fresh, dim, half);
                store_kv(layer, at + values, fresh + (size_t)kv_heads * dim, dim, half);
            }
        }
        float *scores = (float *)malloc(sizeof(float) * (size_t)together * stride);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        /* One item: a row's query heads that share a KV head (its keys and values read once); the next
         * item to a thread that is done (a prompt's later rows have more to read). */
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < rows * kv_heads * parts; item++) {
            if (!scores) continue;
            const int r = item / (kv_heads * parts), kvh = item / parts % kv_heads, part = item % parts;
            const int h0 = kvh * group + part * together;
            const int n = group - part * together < together ? group - part * together : together;
            const char *k = (const char *)layer + ((size_t)slot[r] * kv_heads + kvh) * head_size * item_size;
            const char *v = k + values * item_size;
            const float *q = qkv + (size_t)r * row_stride + (size_t)h0 * dim;
            float *o = out + ((size_t)r * heads + h0) * dim;
            const int len = (int)pos[r] + 1;
#define ATTEND(CHUNKS, HALF, HEADS) attend(q, k, v, len, scale, scores, stride, o, CHUNKS, HALF, HEADS)
            if (chunks == 4 && n == 3) half ? ATTEND(4, 1, 3) : ATTEND(4, 0, 3);
            else if (chunks == 4 && n == 2) half ? ATTEND(4, 1, 2) : ATTEND(4, 0, 2);
            else if (chunks == 4) half ? ATTEND(4, 1, 1) : ATTEND(4, 0, 1);
            else if (chunks == 8) half ? ATTEND(8, 1, 1) : ATTEND(8, 0, 1);
            else
                for (int h = 0; h < n; h++)
                    half ? attend(q + h * dim, k, v, len, scale, scores, stride, o + h * dim, chunks, 1, 1)
                         : attend(q + h * dim, k, v, len, scale, scores, stride, o + h * dim, chunks, 0, 1);
#undef ATTEND
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
