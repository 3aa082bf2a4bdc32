/* The entry points of the engine's C kernels: what the sources call of one another, and what
 * cpu_kernels.py reads to declare them to ctypes (each returns int; arguments of int, float, size_t or
 * pointer types), so a prototype changed here changes the Python side's with it. */
#ifndef KERNELS_H
#define KERNELS_H

#include <stddef.h>
#include <stdint.h>

int q4_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
              const float *norm_w, float eps, int gated, int accumulate);

int q5g_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
               const float *norm_w, float eps, int gated, int accumulate);

int q8g_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
               const float *norm_w, float eps, int gated, int accumulate);

int q8_matmul(const float *x, int rows, int k, const uint8_t *blob, const float *scale, int n, float *y);

int decode_attention(float *qkv, int rows, int row_stride, int heads, int kv_heads, int dim,
                     void *layer, int half, int slots, int capacity, const int64_t *slot, const int64_t *pos,
                     const float *cos, const float *sin, int rope_positions, float scale, float *out);

int layer_stack(float *x, int rows, int hidden, int layers,
                const uint8_t *const *w_qkv, const uint8_t *const *w_o, const uint8_t *const *w_gu,
                const uint8_t *const *w_down, const int *bits, const float *const *b_qkv, const float *const *b_o,
                const float *const *b_gu, const float *const *b_down, const float *const *ln1,
                const float *const *ln2, const float *eps1, const float *eps2, int heads, int kv_heads,
                int dim, int inter, char *kv, size_t kv_layer_bytes, int half, int slots, int capacity,
                const int64_t *slot, const int64_t *pos, const float *cos, const float *sin,
                int rope_positions, float scale, float *qkv, float *att, float *gu);

#endif
