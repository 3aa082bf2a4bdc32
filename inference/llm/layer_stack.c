/* All the decoder layers of a step in one call: for each layer, the same kernel calls the forward's
 * Python loop makes (q4_matmul.c's matmuls with their fused norm, gating and residual add, and
 * decode_attention.c), in the same order on the same buffers, so the result is bit for bit the
 * loop's, without the Python and ctypes work of 150 calls a step (about 2 ms a step; layer_stack.py).
 *
 * Per layer l, on the residual stream x ([rows, hidden], updated in place):
 *   qkv  = rms_norm(x, ln1[l]) @ Wqkv[l] (+ bias)
 *   att  = attention(qkv) over each row's slot of kv layer l (stores the row's new key and value)
 *   x   += att @ Wo[l] (+ bias)
 *   gu   = rms_norm(x, ln2[l]) @ Wgu[l] (+ bias)
 *   x   += (silu(gu[:, :inter]) * gu[:, inter:]) @ Wdown[l] (+ bias)
 * Weights are q4_matmul.c blobs, of 4, 5 or 8 bits as bits[4 * l + 0..3] says (qkv, o, gate_up, down); a bias
 * is a float32 vector or NULL. The KV layers are kv_layer_bytes
 * apart from kv. Returns 0; -1 for a head dim the attention kernel does not take, -2 when out of
 * memory, -3 for a position beyond the rope tables. */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

static int matmul(int bits, const float *x, int rows, int k, const uint8_t *blob, int n, float *y,
                  const float *norm_w, float eps, int gated, int accumulate) {
    return bits == 8   ? q8g_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate)
           : bits == 5 ? q5g_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate)
                       : q4_matmul(x, rows, k, blob, n, y, norm_w, eps, gated, accumulate);
}

static void add_bias(float *y, int rows, int n, const float *bias) {
    if (!bias) return;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] += bias[i];
}

int layer_stack(float *x, int rows, int hidden, int layers,
                const uint8_t *const *w_qkv, const uint8_t *const *w_o, const uint8_t *const *w_gu,
                const uint8_t *const *w_down, const int *bits, const float *const *b_qkv, const float *const *b_o,
                const float *const *b_gu, const float *const *b_down, const float *const *ln1,
                const float *const *ln2, const float *eps1, const float *eps2, int heads, int kv_heads,
                int dim, int inter, char *kv, size_t kv_layer_bytes, int half, int slots, int capacity,
                const int64_t *slot, const int64_t *pos, const float *cos, const float *sin,
                int rope_positions, float scale, float *qkv, float *att, float *gu) {
    const int qkv_width = (heads + 2 * kv_heads) * dim, att_width = heads * dim;
    for (int l = 0; l < layers; l++) {
        if (matmul(bits[4 * l], x, rows, hidden, w_qkv[l], qkv_width, qkv, ln1[l], eps1[l], 0, 0)) return -2;
        add_bias(qkv, rows, qkv_width, b_qkv[l]);
        const int code = decode_attention(qkv, rows, qkv_width, heads, kv_heads, dim, kv + (size_t)l * kv_layer_bytes,
                                          half, slots, capacity, slot, pos, cos, sin, rope_positions, scale, att);
        if (code) return code;
        if (matmul(bits[4 * l + 1], att, rows, att_width, w_o[l], hidden, x, NULL, 0.0f, 0, 1)) return -2;
        add_bias(x, rows, hidden, b_o[l]);
        if (matmul(bits[4 * l + 2], x, rows, hidden, w_gu[l], 2 * inter, gu, ln2[l], eps2[l], 0, 0)) return -2;
        add_bias(gu, rows, 2 * inter, b_gu[l]);
        if (matmul(bits[4 * l + 3], gu, rows, inter, w_down[l], hidden, x, NULL, 0.0f, 1, 1)) return -2;
        add_bias(x, rows, hidden, b_down[l]);
    }
    return 0;
}
