"""The output head's int8 weights times 15-bit activations on the engine's own kernel (q8_matmul.c,
AVX512-VNNI or AVX2).

The head (vocabulary x hidden, 49152 x 576 for the embedded model) keeps 8 bits per weight under the
int4 and int8 formats: a tied embedding (Q8_0 in a GGUF) loses too much at 4 bits. Its weights are
symmetric per output channel; each activation row becomes two int8 passes (the value, then its
rounding error), as for the int4 layers. Built and loaded with the engine's other C kernels
(cpu_kernels.py); where they cannot run, the head multiplies on oneDNN (weight_formats.lin_w8a8).
"""

from __future__ import annotations

import ctypes

import torch

TILE = 16


def pack(q: torch.Tensor) -> torch.Tensor:
    """The kernel's weight blob from int8 weights ``[out, in]`` (out a multiple of 16, in of 16)."""
    n, k = q.shape
    if n % TILE or k % 16:
        raise ValueError(f"the kernel needs outputs and inputs in multiples of 16, not {n} x {k}")
    shifted = (q.to(torch.int16) + 128).to(torch.uint8)
    # [tiles, 16 outputs, quads, 4 inputs] -> [tiles, quads, 16 outputs, 4 inputs]
    return shifted.reshape(n // TILE, TILE, k // 4, 4).permute(0, 2, 1, 3).contiguous()


def matmul(lib: ctypes.CDLL, x: torch.Tensor, blob: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ W`` for a float32 ``[rows, in]`` x and W packed by :func:`pack` with float32 per-output
    ``scale``: float32 ``[rows, out]``."""
    x = x.contiguous()
    rows, k = x.shape
    n = scale.shape[0]
    # The C loop trusts these: a float32 x whose width matches the blob's (k / 4 quads of n / 16 tiles).
    if x.dtype != torch.float32 or blob.shape != (n // TILE, k // 4, TILE, 4) or k % 16:
        raise ValueError(f"this blob takes a float32 x of {blob.shape[1] * 4} columns, not {x.dtype} of {k}")
    y = torch.empty((rows, n), dtype=torch.float32)
    if rows and lib.q8_matmul(x.data_ptr(), rows, k, blob.data_ptr(), scale.data_ptr(), n, y.data_ptr()) != 0:
        raise MemoryError("q8_matmul could not allocate its activation buffers")
    return y
