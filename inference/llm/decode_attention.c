/* Attention of a step's rows (decoding tokens, and the tokens of prompt chunks) over their own slot of
 * the KV pool, in float32 arithmetic, on AVX512F or AVX2 (simd.h: bit for bit the same results). Built
 * with the engine's other kernels into one library per instruction set by cpu_kernels.py.
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
/* Registers for their queries (HEADS * CHUNKS). The AVX2 build spills them (its 16 ymm hold 8
 * vectors of 16), and still took 8 rows' attention at 1000 tokens in 0.42 ms, against 0.57 with one
 * head at a time (4). */
#define MAX_HELD 12
#define PREFETCH_KEYS 8

/* 16 floats of K or V at element `at`: float32, or float16 (HALF) widened. */
SIMD_INLINE f32x16 load_kv(const void *kv, size_t at, const int HALF) {
    if (HALF) return f32x16_load_ph((const uint16_t *)kv + at);
    return f32x16_load((const float *)kv + at);
}

/* HEADS query heads that share one KV head (consecutive in q and out, `dim` floats apart) over `len`
 * positions. Each key is loaded (and widened) once for all of them. CHUNKS (dim / 16), HALF and HEADS
 * are constants where inlined, so that the queries, a key and the value sums stay in registers
 * (HEADS * CHUNKS <= MAX_HELD). `scores` holds HEADS rows of `stride` floats (len rounded up to 16). */
SIMD_INLINE void attend(
    const float *q, const void *k, const void *v, int len, float scale, float *scores, int stride, float *out,
    const int CHUNKS, const int HALF, const int HEADS) {
    const size_t dim = 16 * CHUNKS;
    f32x16 query[MAX_HEADS][MAX_CHUNKS];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) query[h][c] = f32x16_mul(f32x16_load(q + h * dim + 16 * c), f32x16_set1(scale));
    /* Scores 16 keys at a time: each key's per-lane products, then their lane sums together. The keys
     * are fetched PREFETCH_KEYS ahead and each position's value with its key: in a step the KV comes
     * from memory (the weights pass through the caches in between), and 8 rows' attention at 200
     * tokens took 2.5 instead of 3.2 ms a step (alternated in one process). */
    const size_t bytes = HALF ? 2 : 4; /* of an element */
    f32x16 partial[MAX_HEADS][16];
    for (int t0 = 0; t0 < len; t0 += 16) {
        const int n = len - t0 < 16 ? len - t0 : 16;
        for (int j = 0; j < n; j++) {
            const size_t at = (size_t)(t0 + j) * dim;
            for (size_t line = 0; line < dim * bytes; line += 64) {
                _mm_prefetch((const char *)k + (at + PREFETCH_KEYS * dim) * bytes + line, _MM_HINT_T0);
                _mm_prefetch((const char *)v + at * bytes + line, _MM_HINT_T0);
            }
            f32x16 key[MAX_CHUNKS];
            for (int c = 0; c < CHUNKS; c++) key[c] = load_kv(k, at + 16 * c, HALF);
            for (int h = 0; h < HEADS; h++) {
                f32x16 a = f32x16_mul(query[h][0], key[0]);
                for (int c = 1; c < CHUNKS; c++) a = f32x16_fmadd(query[h][c], key[c], a);
                partial[h][j] = a;
            }
        }
        for (int h = 0; h < HEADS; h++) {
            for (int j = n; j < 16; j++) partial[h][j] = f32x16_zero();
            f32x16_store(scores + h * stride + t0, f32x16_sum_lanes16(partial[h]));
        }
    }
    /* An exact softmax per head. */
    const int whole = len & ~15;
    const mask16 tail = mask16_first(len - whole);
    float inverse[MAX_HEADS];
    for (int h = 0; h < HEADS; h++) {
        float *s = scores + h * stride;
        f32x16 top = f32x16_set1(-INFINITY);
        for (int t = 0; t < whole; t += 16) top = f32x16_max(top, f32x16_load(s + t));
        if (whole < len) top = f32x16_mask_max(top, tail, top, f32x16_load(s + whole));
        const f32x16 shift = f32x16_set1(f32x16_reduce_max(top));
        f32x16 total = f32x16_zero();
        for (int t = 0; t < whole; t += 16) {
            const f32x16 w = f32x16_exp(f32x16_sub(f32x16_load(s + t), shift));
            f32x16_store(s + t, w);
            total = f32x16_add(total, w);
        }
        if (whole < len) {
            const f32x16 w = f32x16_maskz(tail, f32x16_exp(f32x16_sub(f32x16_load(s + whole), shift)));
            f32x16_store(s + whole, w);
            total = f32x16_add(total, w);
        }
        inverse[h] = 1.0f / f32x16_reduce_add(total);
    }
    /* The weighted values: each value loaded once for all heads, one accumulator per head and chunk. */
    f32x16 sum[MAX_HEADS][MAX_CHUNKS];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) sum[h][c] = f32x16_zero();
    for (int t = 0; t < len; t++) {
        f32x16 value[MAX_CHUNKS];
        for (int c = 0; c < CHUNKS; c++) value[c] = load_kv(v, (size_t)t * dim + 16 * c, HALF);
        for (int h = 0; h < HEADS; h++) {
            const f32x16 w = f32x16_set1(scores[h * stride + t]);
            for (int c = 0; c < CHUNKS; c++) sum[h][c] = f32x16_fmadd(w, value[c], sum[h][c]);
        }
    }
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++)
            f32x16_store(out + h * dim + 16 * c, f32x16_mul(sum[h][c], f32x16_set1(inverse[h])));
}

/* Store dim floats at element `at` of kv, as float32 or float16 (rounded to nearest). */
static void store_kv(void *kv, size_t at, const float *from, int dim, int half) {
    if (!half) {
        memcpy((float *)kv + at, from, sizeof(float) * dim);
        return;
    }
    for (int i = 0; i < dim; i += 16)
        f32x16_store_ph((uint16_t *)kv + at + i, f32x16_load(from + i));
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
        f32x16_store(x + i, f32x16_add(f32x16_mul(f32x16_load(x + i), f32x16_load(cos + i)),
                                       f32x16_mul(f32x16_load(rolled + i), f32x16_load(sin + i))));
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
