/* The entry points of the engine's C kernels, shared by the sources that call one another. */
#ifndef KERNELS_H
#define KERNELS_H

#include <stdint.h>

int q4_vnni_matmul(const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
                   const float *norm_w, float eps, int gated, int accumulate);

int decode_attention(float *qkv, int rows, int row_stride, int heads, int kv_heads, int dim,
                     void *layer, int half, int slots, int capacity, const int64_t *slot, const int64_t *pos,
                     const float *cos, const float *sin, int rope_positions, float scale, float *out);

#endif
