"""A GGUF tensor's quantized blocks read as the engine's grouped formats (q4_matmul.c): for every row and
group of 32 inputs, w = q * step + low, q whole, in 4 bits, 5 or 8.

| GGUF type | the engine's format | exact? |
| --- | --- | --- |
| Q4_0, Q4_1 | 4-bit groups | yes: the same numbers |
| Q4_K | 4-bit groups | the 6-bit sub-block scale times the block's float16 scale, rounded to float16 |
| Q5_0, Q5_1 | 5-bit groups | yes |
| Q5_K | 5-bit groups | as Q4_K |
| Q8_0 | 8-bit groups | yes |
| Q6_K | 8-bit groups | no: its scales are per 16 inputs; re-quantized to 8 bits per 32, each weight within an eighth of the larger sub-block's step |

The layouts are ggml's (ggml-quants.c's dequantize_row_*); tests/engine/test_gguf_blocks.py checks each
against gguf-py's own dequantization. Float types (F32, F16, BF16) are not blocks and stay floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

GROUP = 32
SUPER = 256  # a K type's super-block


@dataclass(frozen=True)
class GroupGrid:
    """``[rows, in]`` weights as ``q * step + low`` per group of 32: ``step`` and ``low`` float32
    ``[rows, in/32]`` (float16 values), ``q`` uint8 ``[rows, in/32, 32]``, of ``bits`` (4, 5 or 8)."""

    step: np.ndarray
    low: np.ndarray
    q: np.ndarray
    bits: int

    def weights(self) -> np.ndarray:
        return (self.q * self.step[..., None] + self.low[..., None]).reshape(self.q.shape[0], -1)


FOUR_BIT = frozenset({T.Q4_0, T.Q4_1, T.Q4_K})
FIVE_BIT = frozenset({T.Q5_0, T.Q5_1, T.Q5_K})
EIGHT_BIT = frozenset({T.Q6_K, T.Q8_0})
FLOATS = frozenset({T.F32, T.F16, T.BF16})
SERVED = FOUR_BIT | FIVE_BIT | EIGHT_BIT | FLOATS
EXACT = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0})  # bit for bit; the K types to a float16 scale


def bits_for(kind: T) -> int | None:
    """The engine's group width for a GGUF type: 4, 5, 8, or None for a float type."""
    if kind in FOUR_BIT:
        return 4
    if kind in FIVE_BIT:
        return 5
    if kind in EIGHT_BIT:
        return 8
    if kind in FLOATS:
        return None
    raise ValueError(f"GGUF type {kind.name} is not served")


def _half(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields ``[..., 2]`` bytes as float32 ``[...]``."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-element nibble layout: element j is qs[j] & 15, element j + 16 is qs[j] >> 4."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's fifth bits: bit j of the little-endian 32-bit qh is element j's."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")
    return bits.astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 8 six-bit scales and minimums from their 12 bytes (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), dtype=np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _to_half(values: np.ndarray) -> np.ndarray:
    """Rounded to float16 (the blob's precision), back as float32."""
    return values.astype(np.float16).astype(np.float32)


def decode(kind: T, blocks: np.ndarray, columns: int) -> GroupGrid:
    """``blocks``: uint8 ``[rows, bytes of a row]`` of a GGUF tensor of ``kind`` with ``columns`` inputs."""
    rows = blocks.shape[0]
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[kind]
    if columns % block_elems or blocks.shape[1] != columns // block_elems * block_bytes:
        raise ValueError(f"a {kind.name} row of {columns} inputs is not {blocks.shape[1]} bytes")
    b = blocks.reshape(rows, columns // block_elems, block_bytes)
    if kind in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        d = _half(b[..., 0:2])
        if kind == T.Q8_0:
            q = b[..., 2:].view(np.int8).astype(np.int16) + 128
            return GroupGrid(d, -128.0 * d, q.astype(np.uint8), 8)
        offset = 4 if kind in (T.Q4_1, T.Q5_1) else 2
        m = _half(b[..., 2:4]) if offset == 4 else None
        if kind in (T.Q4_0, T.Q4_1):
            q = _nibbles(b[..., offset:offset + 16])
            return GroupGrid(d, -8.0 * d if m is None else m, q, 4)
        high = _high_bits(b[..., offset:offset + 4])
        q = _nibbles(b[..., offset + 4:offset + 20]) | (high << 4)
        return GroupGrid(d, -16.0 * d if m is None else m, q, 5)
    if kind in (T.Q4_K, T.Q5_K):
        d = _half(b[..., 0:2])[..., None]
        dmin = _half(b[..., 2:4])[..., None]
        sc, mn = _k_scales(b[..., 4:16])
        if kind == T.Q4_K:
            qs = b[..., 16:144].reshape(rows, -1, 4, 32)  # 4 chunks of 64 elements: low nibbles, then high
            q = np.stack([qs & 0x0F, qs >> 4], axis=3)  # [rows, blocks, 4, 2, 32]
            bits = 4
        else:
            qh = b[..., 16:48]  # bit 2c of qh[l] is element 64c + l's, bit 2c + 1 is element 64c + 32 + l's
            qs = b[..., 48:176].reshape(rows, -1, 4, 32)
            shifts = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)
            high = (qh[..., None, None, :] >> shifts) & 1  # [rows, blocks, 4, 2, 32]
            q = np.stack([qs & 0x0F, qs >> 4], axis=3) | (high << 4)
            bits = 5
        q = q.reshape(rows, -1, GROUP)
        step = _to_half(d * sc).reshape(rows, -1)
        low = _to_half(-dmin * mn).reshape(rows, -1)
        return GroupGrid(step, low, q.astype(np.uint8), bits)
    if kind == T.Q6_K:
        return requantize(quants.dequantize(blocks, kind).reshape(rows, columns), 8)
    raise ValueError(f"GGUF type {kind.name} is not a block type the engine reads")


def requantize(weights: np.ndarray, bits: int) -> GroupGrid:
    """Float ``[rows, in]`` weights on an asymmetric grid of ``bits`` per group of 32 (float16 step and low)."""
    top = 2 ** bits - 1
    groups = weights.astype(np.float32).reshape(weights.shape[0], -1, GROUP)
    low = _to_half(groups.min(axis=2))
    high = groups.max(axis=2)
    step = _to_half(np.maximum((high - low) / top, np.float32(1e-12)))
    step = np.where(step > 0, step, np.float32(6e-8))  # a constant group: a step float16 holds, every q 0
    q = np.clip(np.rint((groups - low[..., None]) / step[..., None]), 0, top).astype(np.uint8)
    return GroupGrid(step, low, q, bits)
