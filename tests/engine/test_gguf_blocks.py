"""A GGUF tensor's blocks read as the engine's groups (inference/llm/gguf_blocks.py), type by type, against
gguf-py's own de-quantization of the same bytes; and through the kernel (q4_matmul.c) on its blob."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from inference.llm import gguf_blocks, q4_matmul
from inference.llm.gguf_weights import _unpermuted_rows, stacked
from tests.engine.kernel_builds import assert_same_bits

ROWS, COLUMNS = 48, 512
BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q4_K: 4, T.Q5_0: 5, T.Q5_1: 5, T.Q5_K: 5, T.Q6_K: 8, T.Q8_0: 8}


def random_blocks(kind: T, seed: int) -> np.ndarray:
    """Rows of random blocks of ``kind``: any bytes are a valid block once its float16 scales are finite, so
    every quant, scale and minimum code occurs."""
    elems, size = quants.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(ROWS, COLUMNS // elems, size), dtype=np.uint8)
    halves = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2],
              T.Q5_K: [0, 2], T.Q6_K: [size - 2]}[kind]
    for at in halves:
        scale = (rng.random((ROWS, COLUMNS // elems)) * 0.02 + 1e-3).astype(np.float16)
        blocks[..., at:at + 2] = scale.view(np.uint8).reshape(ROWS, -1, 2)
    return blocks.reshape(ROWS, -1)


@pytest.mark.parametrize("kind", sorted(gguf_blocks.EXACT, key=lambda k: k.name))
def test_the_exact_types_give_gguf_pys_numbers(kind):
    blocks = random_blocks(kind, seed=int(kind))
    grid = gguf_blocks.decode(kind, blocks, COLUMNS)
    reference = quants.dequantize(blocks, kind).reshape(ROWS, COLUMNS)
    assert grid.bits == BITS[kind] == gguf_blocks.bits_for(kind)
    assert grid.q.max() == 2 ** grid.bits - 1  # every code occurs, the top one (a fifth bit set) too
    np.testing.assert_array_equal(grid.weights(), reference)


@pytest.mark.parametrize("kind", [T.Q4_K, T.Q5_K])
def test_the_k_types_differ_only_by_their_scales_float16_rounding(kind):
    """A K type's sub-block scale (6 bits) times the block's float16 scale is rounded to float16: within
    2^-11 of each scale, so of each weight's size (plus the minimum's)."""
    blocks = random_blocks(kind, seed=int(kind))
    grid = gguf_blocks.decode(kind, blocks, COLUMNS)
    reference = quants.dequantize(blocks, kind).reshape(ROWS, COLUMNS)
    bound = 2.0 ** -11 * (np.abs(grid.q * grid.step[..., None]) + np.abs(grid.low[..., None])).reshape(ROWS, COLUMNS)
    assert np.all(np.abs(grid.weights() - reference) <= bound * 1.01 + 1e-9)
    assert grid.bits == BITS[kind] == gguf_blocks.bits_for(kind)
    # Not vacuous: the codes matter.
    assert np.abs(reference).max() > 0 and len(np.unique(grid.q)) == 2 ** (4 if kind == T.Q4_K else 5)


def test_q6_k_is_re_quantized_to_8_bits_within_an_eighth_of_its_own_step():
    """Q6_K's scales are per 16 inputs: in 8-bit groups of 32 a weight moves by at most half the new step, an
    eighth of the larger of the two sub-blocks' steps (63 of their steps over 255 of ours)."""
    blocks = random_blocks(T.Q6_K, seed=6)
    elems, size = quants.GGML_QUANT_SIZES[T.Q6_K]
    raw = blocks.reshape(ROWS, -1, size)
    # Sub-block scales of one sign and similar sizes, as llama.cpp's quantizer makes them for neighbouring inputs.
    rng = np.random.default_rng(7)
    raw[..., 192:208] = rng.integers(40, 90, size=raw[..., 192:208].shape).astype(np.int8).view(np.uint8)
    blocks = raw.reshape(ROWS, -1)
    grid = gguf_blocks.decode(T.Q6_K, blocks, COLUMNS)
    reference = quants.dequantize(blocks, T.Q6_K).reshape(ROWS, COLUMNS)
    d = raw[..., size - 2:].copy().view(np.float16)[..., 0].astype(np.float32)
    steps = np.abs(d[..., None] * raw[..., 192:208].view(np.int8).astype(np.float32)).reshape(ROWS, -1, 2)
    larger = np.repeat(steps.max(axis=2), 32, axis=1)  # per group of 32 inputs
    error = np.abs(grid.weights() - reference)
    assert grid.bits == 8 == gguf_blocks.bits_for(T.Q6_K)
    assert np.all(error <= 0.125 * larger * 1.01), float((error / larger).max())
    assert error.max() > 0  # re-quantized, not copied


def test_a_row_of_the_wrong_length_or_an_unserved_type_is_refused():
    with pytest.raises(ValueError, match="is not"):
        gguf_blocks.decode(T.Q4_0, np.zeros((2, 17), np.uint8), 32)
    with pytest.raises(ValueError, match="not served"):
        gguf_blocks.bits_for(T.IQ2_XS)


def _blob(grid: gguf_blocks.GroupGrid, bits: int | None = None) -> torch.Tensor:
    return q4_matmul.pack(torch.from_numpy(grid.step), torch.from_numpy(grid.low), torch.from_numpy(grid.q),
                          grid.bits if bits is None else bits)


@pytest.mark.parametrize(("parts", "bits"), [
    ([(T.Q4_K, 32), (T.Q5_0, 16)], 5),  # a Q4_K_M file's qkv, or its gate_up
    ([(T.Q5_0, 32), (T.Q8_0, 16)], 8),  # its q and k in Q5_0, v in Q8_0
    ([(T.Q4_K, 16), (T.Q5_K, 16), (T.Q8_0, 16)], 8),
])
def test_the_kernel_multiplies_a_mixed_stack_as_gguf_pys_weights(kernels, parts, bits):
    """A fused matrix of parts of different types packs in the widest width its parts need (4 and 5 bits in 5:
    a 4-bit grid's numbers are 5-bit ones); the kernel's product equals the float64 product of gguf-py's weights
    to the activations' rounding, and the product of the same numbers in 8-bit groups bit for bit."""
    grids, weights = [], []
    for kind, rows in parts:
        blocks = random_blocks(kind, seed=rows + int(kind))[:rows]
        grids.append(gguf_blocks.decode(kind, blocks, COLUMNS))
        weights.append(quants.dequantize(blocks, kind).reshape(rows, COLUMNS))
    grid = stacked(grids)
    assert grid.bits == bits
    blob = _blob(grid)
    w = torch.from_numpy(np.concatenate(weights))  # [out, in]
    x = torch.randn(5, COLUMNS, generator=torch.Generator().manual_seed(1))
    exact = x.double() @ w.double().t()
    ours = q4_matmul.matmul(kernels, x, blob, w.shape[0])
    assert ((ours.double() - exact).norm() / exact.norm()).item() < 1e-3
    assert_same_bits(ours, q4_matmul.matmul(kernels, x, _blob(grid, 8), w.shape[0]))


@pytest.mark.parametrize("kind", [T.Q5_0, T.Q5_1, T.Q5_K])
def test_the_5_bit_types_run_as_their_own_numbers(kernels, kind):
    """A Q5 tensor's 5-bit blob through the kernel, read back with identity rows: gguf-py's weights (the exact
    types exactly, Q5_K to its scales' float16 rounding) to float32 rounding of the kernel's sums."""
    blocks = random_blocks(kind, seed=50 + int(kind))
    grid = gguf_blocks.decode(kind, blocks, COLUMNS)
    blob = _blob(grid)
    assert q4_matmul.bits_of(blob) == 5 and blob.shape[2] == q4_matmul.BLOCK_BYTES_5
    back = q4_matmul.matmul(kernels, torch.eye(COLUMNS), blob, ROWS).t().double()
    np.testing.assert_allclose(back.numpy(), grid.weights(), rtol=1e-5, atol=1e-6 * np.abs(grid.weights()).max())
    reference = quants.dequantize(blocks, kind).reshape(ROWS, COLUMNS)
    if kind in gguf_blocks.EXACT:
        np.testing.assert_array_equal(grid.weights(), reference)


def test_query_rows_come_back_in_transformers_order():
    """llama.cpp interleaves each head's two rotary halves; transformers' reverse permutation, on row numbers."""
    order = _unpermuted_rows(8, heads=2)
    assert order.tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
