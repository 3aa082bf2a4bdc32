"""A step's decoder layers in one call of the engine's C kernels (layer_stack.c).

The forward's Python loop makes five kernel calls a layer (four int4 matmuls and the attention),
150 a step for the embedded model's 30 layers, each with its Python and ctypes work (argument
checks, an output tensor, marshalling: 6 us for the attention's alone, measured apart) while the
other OpenMP thread waits; a step took about 2 ms longer in all (see ENGINE.md). Here the pointers
are gathered and checked once, when the weights are laid out, and a step is one call: the same
kernel calls in the same order on the same buffers, so the hidden states are bit for bit the loop's.
It runs where every layer's matmuls are on q4_matmul.c (4-, 5- or 8-bit groups, each matrix its own), the
attention is on decode_attention.c and the MLP is SiLU-gated (Llama-family models on this CPU's int4
format, or a GGUF's own types).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import decode_attention, q4_matmul


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the kernels take it: q4_matmul blobs with their output counts and optional
    float32 biases, and the two RMSNorms' weights and epsilons."""

    qkv: tuple[torch.Tensor, int, torch.Tensor | None]
    o: tuple[torch.Tensor, int, torch.Tensor | None]
    gate_up: tuple[torch.Tensor, int, torch.Tensor | None]
    down: tuple[torch.Tensor, int, torch.Tensor | None]
    ln1: torch.Tensor
    eps1: float
    ln2: torch.Tensor
    eps2: float


def _pointers(tensors: Sequence[torch.Tensor | None]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])


class LayerStack:
    """The pointers of every layer's weights, checked against the shapes the C loop assumes."""

    def __init__(self, lib: ctypes.CDLL, layers: Sequence[LayerWeights], *, heads: int, kv_heads: int,
                 head_dim: int, cos: torch.Tensor, sin_signed: torch.Tensor, scale: float) -> None:
        """``cos``/``sin_signed``: the rope tables as decode_attention.attend takes them."""
        if not layers:
            raise ValueError("no layers")
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not share {kv_heads} KV heads evenly")
        for table in (cos, sin_signed):
            if table.dtype != torch.float32 or not table.is_contiguous() or table.shape[1:] != (head_dim,):
                raise ValueError(f"the rope tables must be contiguous float32 [positions, {head_dim}] tensors")
        first = layers[0]
        self.hidden = first.ln1.shape[0]
        self.qkv_width = (heads + 2 * kv_heads) * head_dim
        self.att_width = heads * head_dim
        self.inter = first.gate_up[1] // 2
        expected = {"qkv": self.qkv_width, "o": self.hidden, "gate_up": 2 * self.inter, "down": self.hidden}
        inputs = {"qkv": self.hidden, "o": self.att_width, "gate_up": self.hidden, "down": self.inter}
        self._keep: list[torch.Tensor] = []  # every tensor a pointer below refers to
        columns: dict[str, list[torch.Tensor | None]] = {f"{k}_{p}": [] for k in expected for p in ("w", "b")}
        bits: list[int] = []  # each matrix's weight width, layer by layer in the order of `expected`
        for layer in layers:
            for name, width in expected.items():
                blob, out_features, bias = getattr(layer, name)
                if out_features != width:
                    raise ValueError(f"layer {name} has {out_features} outputs, not {width} like the first layer's")
                if not q4_matmul.fits(blob, inputs[name], width):
                    raise ValueError(f"layer {name}: not a q4_matmul blob of {inputs[name]} inputs to {width} outputs")
                bits.append(q4_matmul.bits_of(blob))
                if bias is not None:
                    if bias.shape != (width,):
                        raise ValueError(f"layer {name}: a bias of {tuple(bias.shape)} for {width} outputs")
                    bias = bias.to(torch.float32).contiguous()
                    self._keep.append(bias)
                self._keep.append(blob)
                columns[f"{name}_w"].append(blob)
                columns[f"{name}_b"].append(bias)
            for norm in (layer.ln1, layer.ln2):
                if norm.dtype != torch.float32 or not norm.is_contiguous() or norm.shape != (self.hidden,):
                    raise ValueError("the norms' weights must be contiguous float32 vectors of the hidden size")
                self._keep.append(norm)
        eps1 = torch.tensor([layer.eps1 for layer in layers], dtype=torch.float32)
        eps2 = torch.tensor([layer.eps2 for layer in layers], dtype=torch.float32)
        widths = torch.tensor(bits, dtype=torch.int32)
        self._keep += [eps1, eps2, cos, sin_signed, widths]
        self._arrays = [_pointers(columns[f"{k}_w"]) for k in expected] + [widths.data_ptr()] + \
            [_pointers(columns[f"{k}_b"]) for k in expected] + \
            [_pointers([layer.ln1 for layer in layers]), _pointers([layer.ln2 for layer in layers]),
             eps1.data_ptr(), eps2.data_ptr()]
        self._lib = lib
        self.layers = len(layers)
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, float(scale)
        self.cos, self.sin_signed = cos, sin_signed

    def run(self, x: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Every layer over ``x`` (float32 ``[rows, hidden]``, contiguous; updated in place). ``kv``: the
        pool, ``[layers, 2, slots, kv_heads, capacity, head_dim]``, contiguous, float32 or float16;
        each row's new key and value are stored at its position of its slot. ``slots``/``positions``:
        int64 ``[rows]``."""
        rows = x.shape[0]
        if x.dtype != torch.float32 or not x.is_contiguous() or x.shape[1:] != (self.hidden,):
            raise ValueError(f"the layers take a contiguous float32 [rows, {self.hidden}] residual stream")
        if (kv.dtype not in (torch.float32, torch.float16) or not kv.is_contiguous() or kv.dim() != 6
                or kv.shape[0] != self.layers or kv.shape[1] != 2 or kv.shape[3] != self.kv_heads
                or kv.shape[5] != self.head_dim):
            raise ValueError("the KV pool does not fit these layers")
        for t in (slots, positions):
            if t.dtype != torch.int64 or not t.is_contiguous() or t.shape != (rows,):
                raise ValueError(f"slots and positions must be contiguous int64 [{rows}] tensors")
        if rows == 0:
            return
        # The C code stores each row's KV at [slot, position] unchecked.
        if not (0 <= int(slots.min()) and int(slots.max()) < kv.shape[2]
                and 0 <= int(positions.min()) and int(positions.max()) < kv.shape[4]):
            raise ValueError(f"a slot or position outside the pool's {kv.shape[2]} slots of {kv.shape[4]} tokens")
        qkv = torch.empty((rows, self.qkv_width), dtype=torch.float32)
        att = torch.empty((rows, self.att_width), dtype=torch.float32)
        gate_up = torch.empty((rows, 2 * self.inter), dtype=torch.float32)
        code = self._lib.layer_stack(
            x.data_ptr(), rows, self.hidden, self.layers, *self._arrays, self.heads, self.kv_heads, self.head_dim,
            self.inter, kv.data_ptr(), kv.stride(0) * kv.element_size(), int(kv.dtype == torch.float16), kv.shape[2],
            kv.shape[4], slots.data_ptr(), positions.data_ptr(), self.cos.data_ptr(), self.sin_signed.data_ptr(),
            self.cos.shape[0], self.scale, qkv.data_ptr(), att.data_ptr(), gate_up.data_ptr())
        decode_attention.raise_for(code, self.head_dim, self.cos.shape[0])
