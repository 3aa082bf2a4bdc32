/* y = x @ W for W in 4-, 5- or 8-bit groups of 32 (w = q * d + m; q in 0..15 as in Q4_1, 0..31 as in Q5_1, or
 * 0..255), on AVX512-VNNI or AVX2.
 *
 * Built with the engine's other kernels into one library per instruction set by cpu_kernels.py (gcc,
 * at first use; simd.h says what differs between the builds). Each row of x is written per group of
 * 32 as u * qx, with qx = 256 * hi + lo a 15-bit whole number held as two int8 (quantize_group). The
 * products of 4-bit (5-, 8-bit) weights and 8-bit activations add up exactly in int32 (VPDPBUSD, 64 at a time,
 * once for hi and once for lo; on AVX2, VPMADDUBSW and VPMADDWD); the group's sum is then scaled in
 * float:
 *     y[r, n] += d[n, g] * u[r, g] * dot(q[n, g], qx[r, g]) + m[n, g] * u[r, g] * sum(qx[r, g])
 * Lanes run over 16 outputs; each 32-bit lane takes 4 consecutive inputs. Every row goes through the
 * same instructions whatever the other rows are, and whole numbers add up exactly, so a row's result
 * does not depend on the batch, nor on the build.
 *
 * The weight blob: for each tile of 16 outputs, for each group of 32 inputs, 320 bytes (4 bits), 384
 * (5 bits) or 576 (8 bits):
 *   4 bits: 256 bytes of q: 4 chunks of 64 bytes; chunk c holds input quads 2c (low nibbles) and
 *       2c+1 (high nibbles), byte 4*j + i being output j's input 4*quad + i;
 *   5 bits: q's low 4 bits as the 4-bit format's 256 bytes, then a 64-byte plane of their fifth bits:
 *       8 little-endian uint64 words, bit 4*j + i of word quad being output j's input 4*quad + i's
 *       (the byte order of a quad's 64 bytes in either format), so q = nibble | bit << 4;
 *   8 bits: 512 bytes of q: 8 chunks of 64 bytes, chunk c holding input quad c, byte 4*j + i as above;
 *   then 16 float16 d, then 16 float16 m (the tile's outputs).
 * The 4-bit format holds Q4_0, Q4_1 and Q4_K, the 5-bit one Q5_0, Q5_1 and Q5_K, the 8-bit one Q8_0
 * (and Q6_K, re-quantized) exactly (gguf_blocks.py).
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
#define BLOCK_BYTES_5 384
#define BLOCK_BYTES_8 576
#define Q_BYTES(BITS) ((BITS) == 8 ? 512 : (BITS) == 5 ? 320 : 256)
#define GROUP_BYTES(BITS) ((BITS) == 8 ? BLOCK_BYTES_8 : (BITS) == 5 ? BLOCK_BYTES_5 : BLOCK_BYTES)
/* Rows multiplied together on each tile's weights, their sums in registers (the AVX2 loop takes them
 * one after another on the weights it holds). */
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
    f32x16 squares = f32x16_zero();
    for (int i = 0; i < k; i += 16) {
        const f32x16 v = f32x16_load(row + i);
        squares = f32x16_fmadd(v, v, squares);
    }
    return 1.0f / sqrtf(f32x16_reduce_add(squares) / (float)k + eps);
}

/* The 32 inputs of group g of row r, transformed, into v[0..1]: x itself; x * inv_rms * w (RMSNorm,
 * with norm_w); or with gated, silu(a) * b for a row [a | b] of 2k floats (a SwiGLU MLP's gate and
 * up projections). */
SIMD_INLINE void group_input(const float *x, int r, int k, int g, const float *norm_w, float inv_rms, int gated,
                             f32x16 v[2]) {
    for (int h = 0; h < 2; h++) {
        const int i = g * GROUP + 16 * h;
        if (gated) {
            const float *a = x + (size_t)r * 2 * k + i;
            const f32x16 gate = f32x16_load(a);
            const f32x16 one = f32x16_set1(1.0f);
            const f32x16 sigmoid = f32x16_div(one, f32x16_add(one, f32x16_exp(f32x16_sub(f32x16_zero(), gate))));
            v[h] = f32x16_mul(f32x16_mul(gate, sigmoid), f32x16_load(a + k));
        } else if (norm_w) {
            const f32x16 scaled = f32x16_mul(f32x16_load(x + (size_t)r * k + i), f32x16_set1(inv_rms));
            v[h] = f32x16_mul(scaled, f32x16_load(norm_w + i));
        } else {
            v[h] = f32x16_load(x + (size_t)r * k + i);
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
SIMD_INLINE void quantize_group(const f32x16 v[2], int rows, int r, int k, int g, int8_t *qx, float *factors) {
    const int groups = k / GROUP;
    const int r0 = r - r % MAX_ROWS;
    const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
    int8_t *hi = qx + (size_t)2 * r0 * k + (size_t)g * 2 * n * GROUP + (size_t)(r - r0) * GROUP;
    int8_t *lo = hi + (size_t)n * GROUP;
    float *f = factors + (size_t)2 * r0 * groups + (size_t)g * 2 * n + (r - r0);
    int total = 0;
    const float amax = f32x16_reduce_max(f32x16_max(f32x16_abs(v[0]), f32x16_abs(v[1])));
    const float s = amax / 127.0f;
    const f32x16 inv = f32x16_set1(amax > 0.0f ? 127.0f / amax : 0.0f);
    const f32x16 inv_fine = f32x16_set1(amax > 0.0f ? 256.0f * 127.0f / amax : 0.0f);
    for (int h = 0; h < 2; h++) {
        i32x16 qh, ql;
        split_hi_lo(v[h], s, inv, inv_fine, &qh, &ql);
        i32x16_store_i8(hi + 16 * h, qh);
        i32x16_store_i8(lo + 16 * h, ql);
        total += 256 * i32x16_reduce_add(qh) + i32x16_reduce_add(ql);
    }
    f[0] = s / 256.0f;
    f[n] = s / 256.0f * (float)total;
}

/* The group's weights at blk (bytes a group), fetched ahead into L1 and L2. */
SIMD_INLINE void prefetch_group(const uint8_t *blk, const int bytes) {
    for (int line = 0; line < bytes; line += 64) {
        _mm_prefetch((const char *)(blk + PREFETCH_GROUPS * bytes + line), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + PREFETCH_GROUPS_L2 * bytes + line), _MM_HINT_T1);
    }
}

#ifdef __AVX512F__
/* One tile of 16 outputs for a block of ROWS (1..MAX_ROWS) rows, of BITS-bit weights; inlined with
 * constant ROWS and BITS so that the accumulators stay in registers. */
SIMD_INLINE void tile_rows(const uint8_t *tile_blob, int groups, const int8_t *qx, const float *factors, float *y,
                           int n, int accumulate, const int ROWS, const int BITS) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const int bytes = GROUP_BYTES(BITS);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *blk = tile_blob + (size_t)g * bytes;
        prefetch_group(blk, bytes);
        const int8_t *hi = qx + (size_t)g * 2 * ROWS * GROUP;
        const int8_t *lo = hi + ROWS * GROUP;
        const float *f = factors + (size_t)g * 2 * ROWS;
        /* Chunk by chunk of 64 bytes of weights, each row's hi and lo sums advance side by side:
         * 2 * ROWS independent VPDPBUSD chains in flight (a chain alone waits on each instruction's
         * latency), and only the chunk's weights held in registers. */
        __m512i dot[MAX_ROWS], dot_lo[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) dot[r] = dot_lo[r] = _mm512_setzero_si512();
        if (BITS == 8) {
            for (int c = 0; c < 8; c++) {
                const __m512i w = _mm512_loadu_si512((const void *)(blk + 64 * c));
                for (int r = 0; r < ROWS; r++) {
                    dot[r] = dot4(dot[r], w, hi + r * GROUP + 4 * c);
                    dot_lo[r] = dot4(dot_lo[r], w, lo + r * GROUP + 4 * c);
                }
            }
        } else {
            for (int c = 0; c < 4; c++) {
                const __m512i packed = _mm512_loadu_si512((const void *)(blk + 64 * c));
                __m512i w_even = _mm512_and_si512(packed, low_nibbles);
                __m512i w_odd = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
                if (BITS == 5) { /* 16 added to the bytes whose fifth bit is set: q in 0..31 */
                    uint64_t bits[2];
                    memcpy(bits, blk + 256 + 16 * c, 16);
                    w_even = _mm512_mask_add_epi8(w_even, _cvtu64_mask64(bits[0]), w_even, sixteen);
                    w_odd = _mm512_mask_add_epi8(w_odd, _cvtu64_mask64(bits[1]), w_odd, sixteen);
                }
                for (int r = 0; r < ROWS; r++) {
                    dot[r] = dot4(dot[r], w_even, hi + r * GROUP + 8 * c);
                    dot_lo[r] = dot4(dot_lo[r], w_even, lo + r * GROUP + 8 * c);
                }
                for (int r = 0; r < ROWS; r++) {
                    dot[r] = dot4(dot[r], w_odd, hi + r * GROUP + 8 * c + 4);
                    dot_lo[r] = dot4(dot_lo[r], w_odd, lo + r * GROUP + 8 * c + 4);
                }
            }
        }
        /* |256 * dot_hi + dot_lo| <= 257 * 32 * 255 * 128: no int32 overflow. */
        for (int r = 0; r < ROWS; r++) dot[r] = _mm512_add_epi32(_mm512_slli_epi32(dot[r], 8), dot_lo[r]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + Q_BYTES(BITS))));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + Q_BYTES(BITS) + 32)));
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
#else
/* The 32 fifth bits at p (a little-endian uint32; bit b is byte b's) as 32 bytes of 16 or 0: byte b
 * takes source byte b / 8 (the lanes' shuffle sees the same 4 bytes in each 128-bit half), keeps its
 * bit b % 8, and that bit set becomes 16. */
SIMD_INLINE __m256i fifth_bits(const uint8_t *p) {
    int32_t word;
    memcpy(&word, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(word),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* The AVX2 build's tile, one 8-output half at a time (the 32 bytes of each 64-byte chunk that hold its
 * outputs).
 * 4 bits: a group's 8 quads of weights are unpacked once into 8 registers, then the rows take their
 * turns on them, one row's two int16 sums (hi and lo) at a time: AVX2's 16 ymm registers cannot hold
 * every row's sums side by side as the VNNI loop does (with them, spilled, 8 rows took 12% longer).
 * VPMADDUBSW multiplies 4-bit weights by int8 activations into int16 pairs (at most 2 * 15 * 127, so
 * no saturation) and the group's 8 quads add up in int16 (at most 30480); VPMADDWD by 256 (hi) and by
 * 1 (lo) then makes the int32 sum 256 * dot_hi + dot_lo: the VNNI build's whole number exactly,
 * followed by the same float operations per lane.
 * 5 bits: the same, on quads whose bytes get 16 added where their fifth bit is set (fifth_bits); a
 * pair then reaches 2 * 31 * 127 = 7874, so only 4 quads add up in int16 (31496, where 8 would wrap),
 * and each 4 quads' sums are widened to int32 on their own before they are added: the same whole number.
 * 8 bits: VPMADDUBSW would saturate on 255 * 127 * 2, so each weight byte is taken as its two nibbles,
 * w = 16 * high + low, each as the 4-bit loop takes them (four int16 sums, each at most 30480), and
 * VPMADDWD by 4096, 16, 256 and 1 makes the same whole number as VNNI's; the row reads its group's
 * weights from L1 again for each row (16 registers do not hold 16 unpacked quads). */
SIMD_INLINE void tile_rows(const uint8_t *tile_blob, int groups, const int8_t *qx, const float *factors, float *y,
                           int n, int accumulate, const int ROWS, const int BITS) {
    const __m256i low_nibbles = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), times256 = _mm256_set1_epi16(256);
    const __m256i times16 = _mm256_set1_epi16(16), times4096 = _mm256_set1_epi16(4096);
    const int bytes = GROUP_BYTES(BITS);
    for (int half = 0; half < 2; half++) {
        __m256 acc[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *blk = tile_blob + (size_t)g * bytes;
            if (half == 0) prefetch_group(blk, bytes); /* the second half finds the tile in L1 */
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + Q_BYTES(BITS) + 16 * half)));
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + Q_BYTES(BITS) + 32 + 16 * half)));
            const int8_t *hi = qx + (size_t)g * 2 * ROWS * GROUP;
            const int8_t *lo = hi + ROWS * GROUP;
            const float *f = factors + (size_t)g * 2 * ROWS;
            if (BITS == 8) {
                for (int r = 0; r < ROWS; r++) {
                    __m256i sums[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                       _mm256_setzero_si256()};
                    for (int quad = 0; quad < 8; quad++) {
                        const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 64 * quad + 32 * half));
                        const __m256i w_low = _mm256_and_si256(w, low_nibbles);
                        const __m256i w_high = _mm256_and_si256(_mm256_srli_epi16(w, 4), low_nibbles);
                        const __m256i x_hi = broadcast4(hi + r * GROUP + 4 * quad);
                        const __m256i x_lo = broadcast4(lo + r * GROUP + 4 * quad);
                        sums[0] = _mm256_add_epi16(sums[0], _mm256_maddubs_epi16(w_high, x_hi));
                        sums[1] = _mm256_add_epi16(sums[1], _mm256_maddubs_epi16(w_high, x_lo));
                        sums[2] = _mm256_add_epi16(sums[2], _mm256_maddubs_epi16(w_low, x_hi));
                        sums[3] = _mm256_add_epi16(sums[3], _mm256_maddubs_epi16(w_low, x_lo));
                        __asm__("" : "+x"(sums[0]), "+x"(sums[1]), "+x"(sums[2]), "+x"(sums[3]));
                    }
                    const __m256i dot = _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(sums[0], times4096), _mm256_madd_epi16(sums[1], times16)),
                        _mm256_add_epi32(_mm256_madd_epi16(sums[2], times256), _mm256_madd_epi16(sums[3], ones)));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(f[r])), acc[r]);
                    acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(f[ROWS + r]), acc[r]);
                }
                continue;
            }
            __m256i w[8]; /* quad by quad */
            for (int c = 0; c < 4; c++) {
                const __m256i packed = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32 * half));
                w[2 * c] = _mm256_and_si256(packed, low_nibbles);
                w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
            }
            if (BITS == 5)
                for (int quad = 0; quad < 8; quad++)
                    w[quad] = _mm256_or_si256(w[quad], fifth_bits(blk + 256 + 8 * quad + 4 * half));
            for (int r = 0; r < ROWS; r++) {
                __m256i sum_hi = _mm256_maddubs_epi16(w[0], broadcast4(hi + r * GROUP));
                __m256i sum_lo = _mm256_maddubs_epi16(w[0], broadcast4(lo + r * GROUP));
                __m256i first = _mm256_setzero_si256(); /* 5 bits: quads 0-3, widened */
                for (int quad = 1; quad < 8; quad++) {
                    if (BITS == 5 && quad == 4) {
                        first = _mm256_add_epi32(_mm256_madd_epi16(sum_hi, times256), _mm256_madd_epi16(sum_lo, ones));
                        sum_hi = _mm256_maddubs_epi16(w[4], broadcast4(hi + r * GROUP + 16));
                        sum_lo = _mm256_maddubs_epi16(w[4], broadcast4(lo + r * GROUP + 16));
                        continue;
                    }
                    sum_hi = _mm256_add_epi16(sum_hi, _mm256_maddubs_epi16(w[quad], broadcast4(hi + r * GROUP + 4 * quad)));
                    sum_lo = _mm256_add_epi16(sum_lo, _mm256_maddubs_epi16(w[quad], broadcast4(lo + r * GROUP + 4 * quad)));
                    /* Two chains, kept in order: gcc otherwise regroups the adds into trees across
                     * rows, whose many partial sums spill the weights from their registers (8 rows
                     * took 27% longer). */
                    __asm__("" : "+x"(sum_hi), "+x"(sum_lo));
                }
                __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(sum_hi, times256), _mm256_madd_epi16(sum_lo, ones));
                if (BITS == 5) dot = _mm256_add_epi32(first, dot);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(f[r])), acc[r]);
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(f[ROWS + r]), acc[r]);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            float *out = y + (size_t)r * n + 8 * half;
            _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(_mm256_loadu_ps(out), acc[r]) : acc[r]);
        }
    }
}
#endif

/* y[rows, n] = in(x)[rows, k] @ W[k, n], or y += that when accumulate (a residual add); k a multiple
 * of 32, n of 16. in(x) is x itself, or with norm_w, RMSNorm(x) with that weight and eps; with gated,
 * silu(x[:, :k]) * x[:, k:] for an x of 2k columns. Fusing these here saves the step torch's own
 * calls for them: about 15 us for each of a layer's two norms and 10-20 us for its gating.
 * Returns 0, or -1 when out of memory. BITS (4, 5 or 8) is the weights' width. OpenMP outlines the
 * parallel region into one function for every entry point, where BITS is a variable; the tile loops
 * are called for each width with a constant instead, so that each is compiled for its own (with one
 * loop for all, left to gcc to unswitch, adding the 5-bit path made AVX2's 4-bit 8 rows 48% slower). */
SIMD_INLINE int grouped_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
                               const float *norm_w, float eps, int gated, int accumulate, const int BITS) {
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
            f32x16 v[2];
            group_input(x, r, k, g, norm_w, norm_w ? inv_rms[r] : 0.0f, gated, v);
            quantize_group(v, rows, r, k, g, qx, factors);
        }
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *tile_blob = blob + (size_t)t * groups * GROUP_BYTES(BITS);
            for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
                const int8_t *q = qx + (size_t)2 * r0 * k;
                const float *f = factors + (size_t)2 * r0 * groups;
                float *out = y + (size_t)r0 * n + (size_t)t * TILE;
#define TILE_ROWS(ROWS)                                                                          \
    (BITS == 8   ? tile_rows(tile_blob, groups, q, f, out, n, accumulate, ROWS, 8)               \
     : BITS == 5 ? tile_rows(tile_blob, groups, q, f, out, n, accumulate, ROWS, 5)               \
                 : tile_rows(tile_blob, groups, q, f, out, n, accumulate, ROWS, 4))
                switch (rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS) {
                case 1: TILE_ROWS(1); break;
                case 2: TILE_ROWS(2); break;
                case 3: TILE_ROWS(3); break;
                case 4: TILE_ROWS(4); break;
                case 5: TILE_ROWS(5); break;
                case 6: TILE_ROWS(6); break;
                case 7: TILE_ROWS(7); break;
                default: TILE_ROWS(MAX_ROWS); break;
                }
#undef TILE_ROWS
            }
        }
    }
    free(qx);
    free(factors);
    free(inv_rms);
    return 0;
}

int q4_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
              const float *norm_w, float eps, int gated, int accumulate) {
    return grouped_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate, 4);
}

int q5g_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
               const float *norm_w, float eps, int gated, int accumulate) {
    return grouped_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate, 5);
}

int q8g_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
               const float *norm_w, float eps, int gated, int accumulate) {
    return grouped_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate, 8);
}
