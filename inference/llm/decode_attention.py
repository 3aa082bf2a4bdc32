"""Attention of a step's rows over the KV pool on the engine's own CPU kernel (decode_attention.c).

Every row, a decoding token or a prompt token of a chunk, attends over its own slot up to its own
position. torch's flash attention for the CPU is made for long queries: a decoding row cost about 40
us a layer alone and 150 us for eight at 100 tokens of context, rows of different lengths need one
padded, masked call, and each prompt chunk another call with its causal mask. The kernel takes each
(row, KV head), with the query heads that share it, as one work item over exactly its slot's 0..pos,
so it needs no mask, and a row's output never depends on the batch or on how its prompt was chunked.
It first rotates every row's queries and keys (RoPE, when given the tables) and stores its new key
and value in the pool (so a prompt row sees the rows of its chunk before it). The pool may hold float32
or float16 KV (the int4 format's: half the memory, widened to float32 as it is loaded); queries and
sums stay float32. The int8 format's bfloat16 activations and CUDA run
torch's sdpa.
"""

from __future__ import annotations

import ctypes

import torch


def supported(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernel runs a model whose activations are ``dtype`` on ``device``."""
    return device.type == "cpu" and dtype == torch.float32 and head_dim % 16 == 0 and head_dim <= 256


def attend(lib: ctypes.CDLL, qkv: torch.Tensor, heads: int, kv_heads: int, layer: torch.Tensor,
           slots: torch.Tensor, positions: torch.Tensor, scale: float,
           rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``qkv``: float32 ``[rows, heads + 2 * kv_heads, head_dim]`` (queries and keys, then values; rows
    may be strided; rows of one slot in increasing positions). ``rope``: float32 ``(cos, sin)`` tables,
    ``[positions, head_dim]``, ``sin`` with its first half negated; the queries and keys are then
    rotated here, in place, for each row's position (bit for bit as ``x * cos + roll(x, head_dim // 2)
    * sin``); without it they come rotated. ``layer``: one layer of the pool, ``[2, slots, kv_heads,
    capacity, head_dim]``, contiguous, float32 or float16. ``slots`` and ``positions``: int64 ``[rows]``,
    each row's slot and new position. Stores the new keys and values at those positions and returns
    ``[rows, heads * head_dim]``."""
    rows, _, dim = qkv.shape
    if qkv.dtype != torch.float32 or qkv.stride(2) != 1 or qkv.stride(1) != dim:
        raise ValueError("decode attention needs float32 rows of contiguous heads")
    if layer.dtype not in (torch.float32, torch.float16) or not layer.is_contiguous():
        raise ValueError("decode attention needs a contiguous float32 or float16 pool layer")
    cos = sin = None
    if rope is not None:
        cos, sin = rope
        if (cos.dtype != torch.float32 or sin.dtype != torch.float32 or not cos.is_contiguous()
                or not sin.is_contiguous() or cos.shape != sin.shape or cos.shape[1] != dim):
            raise ValueError(f"rope needs contiguous float32 [positions, {dim}] cos and sin tables")
    out = torch.empty((rows, heads * dim), dtype=torch.float32)
    code = lib.decode_attention(qkv.data_ptr(), rows, qkv.stride(0), heads, kv_heads, dim, layer.data_ptr(),
                                int(layer.dtype == torch.float16), layer.shape[1], layer.shape[3], slots.data_ptr(),
                                positions.data_ptr(), None if cos is None else cos.data_ptr(),
                                None if sin is None else sin.data_ptr(), 0 if cos is None else cos.shape[0],
                                scale, out.data_ptr())
    raise_for(code, dim, 0 if cos is None else cos.shape[0])
    return out


def raise_for(code: int, head_dim: int, rope_positions: int) -> None:
    """decode_attention.c's return code (which layer_stack.c passes on) as an exception: -1 a head
    dim it does not take, -3 a position beyond the rope tables, any other nonzero code out of memory."""
    if code == -1:
        raise ValueError(f"decode attention takes head dims in multiples of 16 up to 256, not {head_dim}")
    if code == -3:
        raise ValueError(f"a position beyond the rope tables' {rope_positions}")
    if code != 0:
        raise MemoryError("the engine's kernels could not allocate their buffers")
