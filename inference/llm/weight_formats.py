"""The formats a linear weight runs in, and how each multiplies: the model's own (``native``), 8-bit
(torch's per-channel kernel, oneDNN's int8 GEMM, or q8_matmul.c for the output head), 4-bit groups on
Q4_1's grid (torch's kernel or q4_matmul.c), and a GGUF file's own blocks. Each ``quantize_*`` lays a
``[in, out]`` matrix out as a tuple that its ``lin_*`` multiplies; ``fuse_linear`` first fuses a layer's
projections that share an input (q/k/v, gate/up) into one matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from . import q4_matmul, q8_matmul
from .gguf_blocks import requantize


def fuse_linear(modules: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fuse the weights of ``modules`` (same input) into one *transposed* ``[in, sum(out)]`` matrix.

    ``x @ W_t`` with a row-major ``[in, out]`` matrix (an "NN" GEMM) runs 10-25% faster on this CPU's
    MKL than ``F.linear``'s "NT" GEMM for 4-16 rows (decoding batches), and the same for 1 row or for
    prefill chunks. Each module's weight is re-pointed at a (transposed) view of the fused matrix, so
    the model keeps working unchanged and no weight memory is duplicated. Idempotent.
    """
    marks: list[Any] = [getattr(m, "_lean_fused", None) for m in modules]
    if all(mk is not None for mk in marks) and all(mk[0] is marks[0][0] for mk in marks):
        fused_t = marks[0][0]
        if fused_t.shape[1] == sum(m.out_features for m in modules):
            return fused_t, marks[0][1]
    weights = [m.weight.data for m in modules]
    first = weights[0]
    fused_t = torch.cat(weights, dim=0).t().contiguous()
    bias = None
    if any(m.bias is not None for m in modules):
        bias = torch.cat(
            [m.bias.data if m.bias is not None else torch.zeros(m.out_features, dtype=first.dtype, device=first.device)
             for m in modules]
        ).contiguous()
    offset = 0
    for m in modules:
        n = m.out_features
        m.weight = nn.Parameter(fused_t[:, offset : offset + n].t(), requires_grad=False)
        if bias is not None and m.bias is not None:
            m.bias = nn.Parameter(bias[offset : offset + n], requires_grad=False)
        setattr(m, "_lean_fused", (fused_t, bias))  # noqa: B010 - a mark on a torch module, not an attribute it declares
        offset += n
    return fused_t, bias


def fuse_bias(modules: Sequence[nn.Linear]) -> tuple[None, torch.Tensor | None]:
    """What :func:`fuse_linear` gives of ``modules`` where their weights are not multiplied: (None, their biases
    one after another, zeros for a module without one), or (None, None)."""
    if all(m.bias is None for m in modules):
        return None, None
    return None, torch.cat([m.bias.data.float() if m.bias is not None else torch.zeros(m.out_features)
                            for m in modules]).contiguous()


# "gguf": each linear of a GGUF file in the grouped format that holds its own type (gguf_blocks.py), on the
# engine's kernels: 4-bit groups for Q4_0/Q4_1/Q4_K, 5-bit for Q5_0/Q5_1/Q5_K, 8-bit for Q6_K/Q8_0, the output
# head too.
WEIGHT_FORMATS = ("native", "int8", "int4", "gguf")
INT4_GROUP = 32  # GGUF's Q4_0/Q4_1 block: a Q4_1 checkpoint's weights re-pack without loss


def lin_native(x: torch.Tensor, w: tuple) -> torch.Tensor:
    w_t, b = w
    return torch.mm(x, w_t) if b is None else torch.addmm(b, x, w_t)


def quantize_int8(w_t: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> tuple:
    """Symmetric per-output-channel int8 of a ``[in, out]`` matrix: (int8 ``[out, in]``, scales, bias)."""
    w = w_t.t().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return q, scale.to(dtype).contiguous(), None if b is None else b.to(dtype)


def quantize_int8_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """``--llm-dtype int8`` where the engine's kernels run: an asymmetric 8-bit grid per group of 32 inputs
    (float16 step and minimum, computed here at load: gguf_blocks.requantize), packed as 8-bit groups."""
    grid = requantize(w_t.t().float().numpy(), 8)
    blob = q4_matmul.pack(torch.from_numpy(grid.step), torch.from_numpy(grid.low), torch.from_numpy(grid.q), 8)
    return lib, blob, w_t.shape[1], b


def lin_int8(x: torch.Tensor, w: tuple) -> torch.Tensor:
    q, scale, b = w
    y = torch.ops.aten._weight_int8pack_mm(x.to(scale.dtype), q, scale).to(x.dtype)
    return y if b is None else y + b


def quantize_w8a8(w_t: torch.Tensor, b: torch.Tensor | None) -> tuple:
    """Per-output-channel int8 weights, prepacked for oneDNN's int8 GEMM (VNNI), for :func:`lin_w8a8`."""
    q, scale, _ = quantize_int8(w_t, None, torch.float32)
    packed = torch.ops.onednn.qlinear_prepack(q, None)
    return packed, scale, torch.zeros(scale.shape, dtype=torch.long, device=scale.device), b


def lin_w8a8(x: torch.Tensor, w: tuple) -> torch.Tensor:
    """int8 weights times int8 activations, each row with its own scale, in two passes: the row rounded
    to 8 bits, then its rounding error to 8 more (both as rows of one uint8 GEMM, around 128).

    The products add up in int32, exactly, so a row's result never depends on the other rows of the
    batch. For the 49152 x 576 output head, one call costs 0.8 ms for 1 row and 1.0 ms for 8, against
    1.4 and 4.5 ms with bfloat16 activations (``_weight_int8pack_mm``). One pass alone was too coarse:
    it changed the first answer token of "What is the capital of France?"; with two, the head's top
    token equals float32's at 96.0% of 1000 positions of text, against 94.7% with bfloat16 activations."""
    packed, w_scale, w_zero, b = w
    xf = x.float()
    rows = xf.shape[0]
    step = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)
    high = torch.round(xf / step)
    fine = step / 254.0  # the rounding error is within +-step/2
    low = torch.round((xf - high * step) / fine)
    q = torch.cat([high, low]).add_(128.0).to(torch.uint8)
    y = torch.ops.onednn.qlinear_pointwise(q, 1.0, 128, packed, w_scale, w_zero, None, 1.0, 0, torch.float32,
                                           "none", [], "")
    y = y[:rows].mul_(step).add_(y[rows:].mul_(fine))
    return y if b is None else y + b


def quantize_q8_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """The same per-channel int8 weights as :func:`quantize_w8a8`, packed for q8_matmul.c."""
    q, scale, _ = quantize_int8(w_t, None, torch.float32)
    return lib, q8_matmul.pack(q), scale, b


def lin_q8_kernel(x: torch.Tensor, w: tuple) -> torch.Tensor:
    """The output head on q8_matmul.c: 0.5 ms for 1 row and 1.0 ms for 8 over the 49152 x 576 head,
    against 0.8 and 1.7 ms for :func:`lin_w8a8` (weights in cache; same error against float64)."""
    lib, blob, scale, b = w
    y = q8_matmul.matmul(lib, x.float(), blob, scale)
    return y if b is None else y + b


def int4_grid(w_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``[in, out]`` matrix on Q4_1's grid: per group of INT4_GROUP inputs of each output, its minimum m
    and step d = (max - m) / 15 (``[out, in/G]`` each), and every weight as (w - m) / d (``[out, in/G, G]``;
    whole numbers 0..15 for weights that came from a Q4_1 file)."""
    w = w_t.t().float()
    groups = w.reshape(w.shape[0], -1, INT4_GROUP)
    low = groups.amin(dim=2)
    step = (groups.amax(dim=2) - low) / 15.0
    step = torch.where(step > 0, step, torch.ones_like(step))  # a constant group: every q is 0
    return low, step, (groups - low[..., None]) / step[..., None]


def on_int4_grid(w_t: torch.Tensor) -> bool:
    """Whether a ``[in, out]`` matrix is already 4-bit in groups of INT4_GROUP (as a Q4_1 GGUF's weights are),
    so that "int4" keeps its weights exactly."""
    if w_t.shape[0] % INT4_GROUP or not w_t.is_floating_point():
        return False
    q = int4_grid(w_t)[2]
    return bool((q - q.round()).abs().max() < 1e-3)


def quantize_int4(w_t: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> tuple:
    """Asymmetric 4-bit of a ``[in, out]`` matrix on Q4_1's grid (int4_grid), packed for torch's CPU kernel.

    Weights that came from a Q4_1 file lie on that grid already, so they round-trip to their own 4-bit
    values. Returns (packed ``[out, in/2]`` uint8, scales and zeros ``[in/G, out, 2]`` in `dtype`,
    bias); the kernel computes ``(q - 8) * d + zero``, so zero = m + 8 d."""
    low, step, q = int4_grid(w_t)
    q = torch.round(q).clamp_(0, 15).to(torch.int32).reshape(step.shape[0], -1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([step, low + 8.0 * step], dim=-1).transpose(0, 1).to(dtype).contiguous()
    return packed, scales_and_zeros, b


def quantize_int4_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """The same Q4_1 grid as :func:`quantize_int4`, packed for the engine's int4 kernel (either build)."""
    low, step, q = int4_grid(w_t)
    return lib, q4_matmul.pack(step, low, torch.round(q).clamp_(0, 15)), w_t.shape[1], b


def lin_int4_kernel(x: torch.Tensor, w: tuple, *, norm: tuple[torch.Tensor, float] | None = None,
                   gated: bool = False, add_to: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W (+ bias)`` on q4_matmul.c, optionally normalizing or gating ``x`` first and adding the
    product to ``add_to`` in place (see :func:`q4_matmul.matmul`). int4 activations are float32."""
    lib, blob, out_features, b = w
    y = q4_matmul.matmul(lib, x, blob, out_features, norm=norm, gated=gated, add_to=add_to)
    return y if b is None else y.add_(b)


def lin_int4(x: torch.Tensor, w: tuple) -> torch.Tensor:
    packed, scales_and_zeros, b = w
    # The kernel's fast path takes bfloat16 in and out; the residual stream around it stays float32.
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(scales_and_zeros.dtype), packed, INT4_GROUP, scales_and_zeros)
    y = y.to(x.dtype)
    return y if b is None else y + b
