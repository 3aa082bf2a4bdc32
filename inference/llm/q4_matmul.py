"""int4 (and 5- and 8-bit) weights in groups of 32 times int8 activations on the engine's own kernel
(q4_matmul.c), in its AVX512-VNNI and AVX2 builds: the int4 kernel for x86-64 CPUs, and the 5- and 8-bit
groups that hold a GGUF's 5- and 8-bit types exactly (gguf_blocks.py).

torch's own int4 kernel (``_weight_int4pack_mm_for_cpu``) dequantizes the weights to float and
multiplies with float FMAs, once per block of 4 rows, so its cost grows with the rows. Here the 4-bit
weights meet 8-bit activations in integer dot products (VPDPBUSD, 64 products per instruction; on
AVX2, VPMADDUBSW and VPMADDWD), as in llama.cpp's Q4_1 x Q8_1 dot product; the activations take two
such passes, for 15 bits (q4_matmul.c). Both builds return the same bits. All 30 layers of the
embedded model, alternated in one run: see ``python -m benchmarks.int4_kernels`` and ENGINE.md. No
library on PyPI offers this for torch tensors on this torch (torchao's wheel there carries CUDA
kernels only; Intel's extension stops at torch 2.8).

Built and loaded with the engine's other C kernels by cpu_kernels.py; without gcc or without AVX2
the int4 format runs on torch's kernel.
"""

from __future__ import annotations

import ctypes

import torch

GROUP = 32
TILE = 16
BLOCK_BYTES = 320  # a tile's group: 256 bytes of 4-bit weights, 16 float16 steps, 16 float16 minimums
BLOCK_BYTES_5 = 384  # the same 256 bytes of low 4 bits, then 64 bytes of fifth bits, then the steps and minimums
BLOCK_BYTES_8 = 576  # the same with 512 bytes of 8-bit weights
BITS = {BLOCK_BYTES: 4, BLOCK_BYTES_5: 5, BLOCK_BYTES_8: 8}  # a blob's weight width by its bytes a group
KERNELS = {4: "q4_matmul", 5: "q5g_matmul", 8: "q8g_matmul"}  # the C entry point of each width


def pack(step: torch.Tensor, low: torch.Tensor, q: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """The kernel's weight blob (see q4_matmul.c) from a grid w = q * step + low: ``step`` and ``low``
    ``[out, in/32]``, ``q`` ``[out, in/32, 32]`` whole numbers 0..15 (``bits`` 4), 0..31 (5) or 0..255 (8).
    ``d`` and ``m`` are stored as float16, as Q4_1 itself stores them."""
    n, groups, _ = q.shape
    if n % TILE:
        raise ValueError(f"the kernel needs outputs in multiples of {TILE}, not {n}")
    if bits not in KERNELS:
        raise ValueError(f"the kernel takes 4-, 5- or 8-bit weights, not {bits}")
    if q.numel() and (q.min() < 0 or q.max() > 2 ** bits - 1):
        raise ValueError(f"{bits}-bit weights are whole numbers 0..{2 ** bits - 1}")
    tiles = n // TILE
    # [tiles, 16 outputs, groups, 8 quads, 4 inputs] -> [tiles, groups, 8 quads, 16 outputs, 4 inputs]
    q = q.to(torch.uint8).reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    if bits == 8:
        nibbles = q.reshape(tiles, groups, 512)
    else:
        four = q & 0x0F
        nibbles = (four[:, :, 0::2] | (four[:, :, 1::2] << 4)).reshape(tiles, groups, 256)
        if bits == 5:
            # Per quad, the 64 fifth bits as a little-endian uint64: byte b's bit t is output-input 8 * b + t's.
            fifth = (q >> 4).reshape(tiles, groups, 8, 8, 8) << torch.arange(8, dtype=torch.uint8)
            nibbles = torch.cat([nibbles, fifth.sum(dim=4, dtype=torch.uint8).reshape(tiles, groups, 64)], dim=2)

    def per_tile(values: torch.Tensor) -> torch.Tensor:
        half = values.reshape(tiles, TILE, groups).permute(0, 2, 1).to(torch.float16).contiguous()
        return half.view(torch.uint8).reshape(tiles, groups, 2 * TILE)

    return torch.cat([nibbles, per_tile(step), per_tile(low)], dim=2).contiguous()


def fits(blob: torch.Tensor, in_features: int, out_features: int) -> bool:
    """Whether ``blob`` is what :func:`pack` makes (either width) for ``in_features`` inputs to
    ``out_features`` outputs: the C loop reads exactly ``in / 32`` groups of ``out / 16`` tiles from it,
    unchecked."""
    return (blob.dtype == torch.uint8 and blob.is_contiguous() and in_features % GROUP == 0
            and out_features % TILE == 0 and blob.dim() == 3 and blob.shape[2] in BITS
            and blob.shape[:2] == (out_features // TILE, in_features // GROUP))


def bits_of(blob: torch.Tensor) -> int:
    """The weight width of a blob :func:`pack` made: 4, 5 or 8."""
    return BITS[int(blob.shape[2])]


def matmul(lib: ctypes.CDLL, x: torch.Tensor, blob: torch.Tensor, out_features: int, *,
           norm: tuple[torch.Tensor, float] | None = None, gated: bool = False,
           add_to: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W`` for a float32 ``[rows, in]`` x and W packed by :func:`pack`: float32 ``[rows, out]``.

    In the same call (q4_matmul.c): ``norm=(weight, eps)`` multiplies ``rms_norm(x, weight, eps)``
    instead; ``gated`` multiplies ``silu(x[:, :in]) * x[:, in:]`` for an x of ``2 * in`` columns;
    ``add_to`` (float32, contiguous, ``[rows, out]``) adds the product to that tensor in place and
    returns it (a residual add)."""
    x = x.contiguous()
    rows, k = x.shape
    if gated:
        k //= 2
    if x.dtype != torch.float32 or not fits(blob, k, out_features):
        raise ValueError(f"this blob takes a float32 x of {blob.shape[1] * GROUP} columns to "
                         f"{blob.shape[0] * TILE} outputs, not {x.dtype} of {k} to {out_features}")
    if norm is not None and (gated or norm[0].shape != (k,) or norm[0].dtype != torch.float32):
        raise ValueError("a norm needs a float32 weight of the input's width, and no gating")
    if add_to is None:
        y = torch.empty((rows, out_features), dtype=torch.float32)
    elif add_to.shape != (rows, out_features) or add_to.dtype != torch.float32 or not add_to.is_contiguous():
        raise ValueError(f"add_to must be a contiguous float32 [{rows}, {out_features}] tensor")
    else:
        y = add_to
    weight = norm[0].contiguous() if norm is not None else None
    eps = norm[1] if norm is not None else 0.0
    kernel = getattr(lib, KERNELS[bits_of(blob)])
    if rows and kernel(x.data_ptr(), rows, k, blob.data_ptr(), out_features, y.data_ptr(),
                       None if weight is None else weight.data_ptr(), eps, int(gated), int(add_to is not None)) != 0:
        raise MemoryError("q4_matmul.c could not allocate its activation buffers")
    return y
