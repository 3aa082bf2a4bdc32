"""A lean, ragged-batch forward pass for Llama-family decoder models (Llama, Mistral, Qwen2).

It walks the model's own modules and weights, without transformers' per-call machinery (cache objects,
mask building, output classes), so one decoding step costs little more than reading the weights.

One step takes a *ragged* batch: the new tokens of every active request concatenated into one
``[T, hidden]`` sequence (1 token for a decoding request, a chunk of its prompt for a prefilling one).
Every linear layer then reads its weights once per step for all requests; attention is computed per
request against that request's own KV buffer. Logits are computed only for the rows that need
sampling (the 49152 x 576 ``lm_head`` is the single most expensive matmul of a decoding step).

At construction the q/k/v projections and the gate/up projections of every layer are fused into one
weight each (one matmul instead of three/two). The original modules' weights are re-pointed at views of
the fused tensors, so the model keeps working unchanged (``model.generate()`` still runs) and no weight
memory is duplicated.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..memory import return_freed_memory
from . import cpu_kernels, decode_attention, q4_matmul, q8_matmul
from .gguf_blocks import GroupGrid, requantize
from .gguf_weights import GgufWeights, stacked
from .layer_stack import LayerStack, LayerWeights
from .sdpa_attention import SdpaAttention
from .threads import one_intra_op_thread

if TYPE_CHECKING:
    from .kv_manager import KVLayout, KVPool

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
# RoPE variants whose cos/sin depend only on the position (not on the current sequence length).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


class UnsupportedModel(ValueError):
    """The model's architecture or configuration is not handled by the lean forward pass."""


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict):
        return str(params.get("rope_type") or params.get("type") or "default")
    return "default"


def check_supported(model: nn.Module) -> None:
    """Raise UnsupportedModel with a clear reason when the lean forward cannot run ``model`` exactly."""
    config = model.config
    mtype = getattr(config, "model_type", "?")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"model_type {mtype!r} is not supported by the lean forward (supported: {sorted(SUPPORTED_MODEL_TYPES)})"
        )
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise UnsupportedModel(f"{type(model).__name__} does not have the Llama module layout")
    if not hasattr(model, "lm_head"):
        raise UnsupportedModel(f"{type(model).__name__} has no lm_head")
    window = getattr(config, "sliding_window", None)
    use_sw = getattr(config, "use_sliding_window", True)
    if window is not None and use_sw and window < getattr(config, "max_position_embeddings", 0):
        raise UnsupportedModel(f"sliding-window attention (window {window}) is not supported")
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UnsupportedModel(f"layer types {sorted(set(layer_types))} are not supported (only full_attention)")
    rope = _rope_type(config)
    if rope not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope type {rope!r} is not supported (supported: {sorted(STATIC_ROPE_TYPES)})")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise UnsupportedModel("pretraining_tp > 1 is not supported")
    for i, layer in enumerate(base.layers):
        attn = getattr(layer, "self_attn", None)
        mlp = getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            raise UnsupportedModel(f"layer {i} has no self_attn/mlp")
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(attn, name, None), nn.Linear):
                raise UnsupportedModel(f"layer {i}: self_attn.{name} is not an nn.Linear")
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not isinstance(getattr(mlp, name, None), nn.Linear):
                raise UnsupportedModel(f"layer {i}: mlp.{name} is not an nn.Linear")
        for name in ("q_norm", "k_norm"):
            if getattr(attn, name, None) is not None:
                raise UnsupportedModel(f"layer {i}: per-head {name} (Qwen3/OLMo style) is not supported")
        if getattr(attn, "sliding_window", None):
            raise UnsupportedModel(f"layer {i}: sliding-window attention is not supported")


@dataclass
class Segment:
    """One request's part of a step: ``n`` new tokens written to ``slot`` from position ``start``."""

    slot: int
    start: int
    n: int


class _Layer:
    """One decoder layer's weights as the forward runs them (each linear as its format's tuple)."""

    __slots__ = ("ln1", "ln2", "eps1", "eps2", "qkv", "o", "gu", "down", "act")
    ln1: torch.Tensor
    ln2: torch.Tensor
    eps1: float
    eps2: float
    qkv: tuple
    o: tuple
    gu: tuple
    down: tuple
    act: nn.Module


def _fuse_linear(modules: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def _fuse_bias(modules: Sequence[nn.Linear]) -> tuple[None, torch.Tensor | None]:
    """What :func:`_fuse_linear` gives of ``modules`` where their weights are not multiplied: (None, their biases
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


def _lin_native(x: torch.Tensor, w: tuple) -> torch.Tensor:
    w_t, b = w
    return torch.mm(x, w_t) if b is None else torch.addmm(b, x, w_t)


def _quantize_int8(w_t: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> tuple:
    """Symmetric per-output-channel int8 of a ``[in, out]`` matrix: (int8 ``[out, in]``, scales, bias)."""
    w = w_t.t().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return q, scale.to(dtype).contiguous(), None if b is None else b.to(dtype)


def _quantize_int8_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """``--llm-dtype int8`` where the engine's kernels run: an asymmetric 8-bit grid per group of 32 inputs
    (float16 step and minimum, computed here at load: gguf_blocks.requantize), packed as 8-bit groups."""
    grid = requantize(w_t.t().float().numpy(), 8)
    blob = q4_matmul.pack(torch.from_numpy(grid.step), torch.from_numpy(grid.low), torch.from_numpy(grid.q), 8)
    return lib, blob, w_t.shape[1], b


def _lin_int8(x: torch.Tensor, w: tuple) -> torch.Tensor:
    q, scale, b = w
    y = torch.ops.aten._weight_int8pack_mm(x.to(scale.dtype), q, scale).to(x.dtype)
    return y if b is None else y + b


def _quantize_w8a8(w_t: torch.Tensor, b: torch.Tensor | None) -> tuple:
    """Per-output-channel int8 weights, prepacked for oneDNN's int8 GEMM (VNNI), for :func:`_lin_w8a8`."""
    q, scale, _ = _quantize_int8(w_t, None, torch.float32)
    packed = torch.ops.onednn.qlinear_prepack(q, None)
    return packed, scale, torch.zeros(scale.shape, dtype=torch.long, device=scale.device), b


def _lin_w8a8(x: torch.Tensor, w: tuple) -> torch.Tensor:
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


def _quantize_q8_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """The same per-channel int8 weights as :func:`_quantize_w8a8`, packed for q8_matmul.c."""
    q, scale, _ = _quantize_int8(w_t, None, torch.float32)
    return lib, q8_matmul.pack(q), scale, b


def _lin_q8_kernel(x: torch.Tensor, w: tuple) -> torch.Tensor:
    """The output head on q8_matmul.c: 0.5 ms for 1 row and 1.0 ms for 8 over the 49152 x 576 head,
    against 0.8 and 1.7 ms for :func:`_lin_w8a8` (weights in cache; same error against float64)."""
    lib, blob, scale, b = w
    y = q8_matmul.matmul(lib, x.float(), blob, scale)
    return y if b is None else y + b


def _int4_grid(w_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    q = _int4_grid(w_t)[2]
    return bool((q - q.round()).abs().max() < 1e-3)


def _quantize_int4(w_t: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> tuple:
    """Asymmetric 4-bit of a ``[in, out]`` matrix on Q4_1's grid (_int4_grid), packed for torch's CPU kernel.

    Weights that came from a Q4_1 file lie on that grid already, so they round-trip to their own 4-bit
    values. Returns (packed ``[out, in/2]`` uint8, scales and zeros ``[in/G, out, 2]`` in `dtype`,
    bias); the kernel computes ``(q - 8) * d + zero``, so zero = m + 8 d."""
    low, step, q = _int4_grid(w_t)
    q = torch.round(q).clamp_(0, 15).to(torch.int32).reshape(step.shape[0], -1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([step, low + 8.0 * step], dim=-1).transpose(0, 1).to(dtype).contiguous()
    return packed, scales_and_zeros, b


def _quantize_int4_kernel(w_t: torch.Tensor, b: torch.Tensor | None, lib) -> tuple:
    """The same Q4_1 grid as :func:`_quantize_int4`, packed for the engine's int4 kernel (either build)."""
    low, step, q = _int4_grid(w_t)
    return lib, q4_matmul.pack(step, low, torch.round(q).clamp_(0, 15)), w_t.shape[1], b


def _lin_int4_kernel(x: torch.Tensor, w: tuple, *, norm: tuple[torch.Tensor, float] | None = None,
                   gated: bool = False, add_to: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W (+ bias)`` on q4_matmul.c, optionally normalizing or gating ``x`` first and adding the
    product to ``add_to`` in place (see :func:`q4_matmul.matmul`). int4 activations are float32."""
    lib, blob, out_features, b = w
    y = q4_matmul.matmul(lib, x, blob, out_features, norm=norm, gated=gated, add_to=add_to)
    return y if b is None else y.add_(b)


def _lin_int4(x: torch.Tensor, w: tuple) -> torch.Tensor:
    packed, scales_and_zeros, b = w
    # The kernel's fast path takes bfloat16 in and out; the residual stream around it stays float32.
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(scales_and_zeros.dtype), packed, INT4_GROUP, scales_and_zeros)
    y = y.to(x.dtype)
    return y if b is None else y + b


KERNEL_CHOICES = ("auto", *cpu_kernels.ISAS, "torch")


def resolve_kernels(requested: str) -> str:
    """The kernels a CPU forward runs for the ``--llm-kernels`` setting: "auto" is the fastest build of
    the engine's C kernels this CPU runs ("vnni", then "avx2"), else "torch"; a named build this CPU
    cannot run is an error, not a silent fall-back."""
    if requested not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, not {requested!r}")
    supported = cpu_kernels.supported_isas()
    if requested == "auto":
        return supported[0] if supported else "torch"
    if requested != "torch" and requested not in supported:
        raise UnsupportedModel(f"the engine's {requested} kernels need a CPU with {requested.upper()}; this one runs "
                               f"{', '.join(supported) or 'neither'} (use --llm-kernels auto or torch)")
    return requested


@dataclass(frozen=True)
class KernelPaths:
    """Which part of a forward runs on which build of the engine's C kernels (``kernels``: "vnni", "avx2",
    or "torch" where none runs): int4 matmuls, the 8-bit output head, attention; None where torch's."""

    kernels: str
    int4_kernel: str  # "" (no int4 weights), "torch", or the build
    int4_lib: ctypes.CDLL | None
    head_lib: ctypes.CDLL | None
    attention_lib: ctypes.CDLL | None
    weight_format: str
    device: torch.device

    @classmethod
    def choose(cls, requested: str, kernel_dir: Path | None, *, device: torch.device, weight_format: str,
               dtype: torch.dtype, head_dim: int, hidden: int, vocab_size: int, out_features: list[int]) -> KernelPaths:
        """The fastest build the CPU runs unless ``requested`` names one; a named build that cannot run this
        model is an error, not a silent fall-back."""
        if device.type != "cpu" and requested not in ("auto", "torch"):
            raise UnsupportedModel(f"the engine's {requested} kernels run on a CPU, not on {device.type}")
        kernels = resolve_kernels(requested) if device.type == "cpu" else "torch"
        lib = None
        if kernels != "torch":
            if kernel_dir is None and (requested != "auto" or weight_format in ("int4", "int8")):
                raise ValueError("the engine's kernels need kernel_dir, where they are built")
            lib = None if kernel_dir is None else cpu_kernels.load(kernel_dir, kernels)
            if lib is None and requested != "auto":
                raise UnsupportedModel(f"the engine's {kernels} kernels were asked for but could not be built "
                                       "(see the log)")
            if lib is None:
                kernels = "torch"
        # int4 runs on the VNNI kernel where the engine's kernels run and every output count is a multiple
        # of its tile: 2.7x torch's int4 kernel for 8 rows, 3.2x for 64-256, 1.8x for one row
        # (benchmarks/int4_kernels.py).
        int4_kernel, int4_lib = "", None
        if weight_format == "gguf":
            if device.type != "cpu" or lib is None or dtype != torch.float32 or any(n % q4_matmul.TILE for n in out_features):
                raise UnsupportedModel("a GGUF file's own types run on the engine's kernels, on a CPU that runs them "
                                       f"(this one: {kernels}), with outputs in multiples of {q4_matmul.TILE}")
            int4_kernel, int4_lib = kernels, lib
        if weight_format in ("int4", "int8") and device.type == "cpu":
            if lib is not None and dtype == torch.float32 and all(n % q4_matmul.TILE == 0 for n in out_features):
                int4_kernel, int4_lib = kernels, lib
            elif weight_format == "int4":
                int4_kernel = "torch"
            # (int8 elsewhere: torch's per-channel int8 kernel, in bfloat16)
        # The 8-bit output head of the int4 and int8 formats multiplies on q8_matmul.c where it runs, else
        # on oneDNN (_lin_w8a8).
        head_lib = lib if (weight_format not in ("native", "gguf") and lib is not None
                           and vocab_size % q8_matmul.TILE == 0 and hidden % 16 == 0) else None
        # Every row of a step attends on the kernel of decode_attention.c where it runs (float32
        # activations), else on sdpa.
        attention_lib = lib if lib is not None and decode_attention.supported(head_dim, dtype, device) else None
        if lib is not None and int4_lib is None and head_lib is None and attention_lib is None:
            # Nothing of this model and format runs on them (they take float32 activations).
            if requested != "auto":
                raise UnsupportedModel(f"the engine's kernels do not run {weight_format} weights with {dtype} "
                                       "activations (use --llm-kernels auto or torch)")
            kernels = "torch"
        return cls(kernels, int4_kernel, int4_lib, head_lib, attention_lib, weight_format, device)

    def prepare(self, fused: tuple[torch.Tensor | None, torch.Tensor | None], *, head: bool = False,
                grids: Sequence[GroupGrid | None] = ()) -> tuple:
        """A ``[in, out]`` weight (and bias) laid out for what multiplies it: as it is (native), int8, int4
        (packed for the engine's kernel where it runs), or the output head's 8 bits; under "gguf", the file's
        own blocks (``grids``, one per fused matrix, from GgufWeights: no float weight needed), or as it is
        where they are floats."""
        w_t, b = fused
        if self.weight_format == "gguf" and grids and all(g is not None for g in grids):
            grid = stacked([g for g in grids if g is not None])
            blob = q4_matmul.pack(torch.from_numpy(grid.step), torch.from_numpy(grid.low), torch.from_numpy(grid.q),
                                  grid.bits)
            return self.int4_lib, blob, grid.step.shape[0], b
        if w_t is None:
            raise UnsupportedModel("a weight has neither the file's blocks nor floats to multiply")
        if self.weight_format == "gguf":
            return (w_t, b)  # a float tensor of the file: multiplied as it is
        if self.weight_format == "int8" and not head and self.int4_lib is not None:
            return _quantize_int8_kernel(w_t, b, self.int4_lib)
        if self.weight_format == "int4" and not head:
            if self.device.type != "cpu" or w_t.shape[0] % INT4_GROUP:
                raise UnsupportedModel(f"int4 weights need the CPU and inputs in groups of {INT4_GROUP}")
            if self.int4_lib is not None:
                return _quantize_int4_kernel(w_t, b, self.int4_lib)
            try:
                return _quantize_int4(w_t, b, torch.bfloat16)
            except RuntimeError as exc:  # pragma: no cover - shapes the packing kernel does not take
                raise UnsupportedModel(f"int4 weights are not supported for a {tuple(w_t.shape)} matrix: {exc}") from exc
        if head and self.weight_format != "native" and self.device.type == "cpu":
            # The output head stays 8-bit under int4: a tied embedding (Q8_0 in a GGUF) loses too much at 4 bits.
            if self.head_lib is not None:
                return _quantize_q8_kernel(w_t, b, self.head_lib)
            return _quantize_w8a8(w_t, b)
        if self.weight_format != "native":
            return _quantize_int8(w_t, b, torch.bfloat16)
        return (w_t, b)


class LeanForward:
    """Ragged-batch forward over a Llama-family ``*ForCausalLM`` model's own weights.

    Use :meth:`for_model` to share one instance per model (construction re-lays the model's weights).
    """

    @classmethod
    def for_model(cls, model: nn.Module, context_window: int = 0, weight_format: str = "native",
                  kernel_dir: Path | None = None, kernels: str = "auto", gguf: GgufWeights | None = None) -> LeanForward:
        cache = getattr(model, "_lean_forward", None)
        if not isinstance(cache, dict):
            cache = {}
            setattr(model, "_lean_forward", cache)  # noqa: B010 - one forward per model and format
        key = (weight_format, kernels)
        cached = cache.get(key)
        if isinstance(cached, cls) and cached.max_positions >= context_window:
            return cached
        if getattr(model, "_lean_released", False):
            raise UnsupportedModel("the model's linear weights were released (LeanForward.release_model_weights)")
        with one_intra_op_thread():  # re-laying the weights must not leave an OpenMP pool on this thread
            inst = cls(model, context_window, weight_format=weight_format, kernel_dir=kernel_dir, kernels=kernels,
                       gguf=gguf)
        cache[key] = inst
        return inst

    def __init__(self, model: nn.Module, context_window: int = 0, *, weight_format: str = "native",
                 kernel_dir: Path | None = None, kernels: str = "auto", gguf: GgufWeights | None = None) -> None:
        """``weight_format``: "native" runs the model's own weights in their dtype (exact: the same tokens
        as ``generate()``). "int8" runs the linear weights as 8-bit groups of 32 (an asymmetric grid per
        group, computed at load) on the engine's kernels where they run, as int4 does; elsewhere symmetric
        per-channel int8 copies with bfloat16 activations and KV (torch's weight-only kernel). "int4" (CPU) runs the layers' linear
        weights as 4-bit groups of 32 (lossless for a Q4_1 GGUF such as the embedded model), on the
        engine's int4 kernel (15-bit activations; built into ``kernel_dir``) where the CPU runs one
        of its builds, else on torch's int4 kernel with bfloat16 matmul inputs; the residual stream,
        norms and attention stay in the model's float32, the KV is float16 where the engine's
        attention kernel runs. Both run the output head as int8, on the CPU with int8 activations
        too (the engine's q8 kernel, else :func:`_lin_w8a8`). "gguf" (CPU, the engine's kernels) runs each
        linear weight of the GGUF file ``gguf`` in the grouped format that holds its own type, the output head
        too (floats where the file's head is floats), on the engine's kernels, with float32 activations
        elsewhere and float16 KV, as int4. ``kernels`` (``KERNEL_CHOICES``) picks the build of the engine's
        kernels, or torch's (see :func:`resolve_kernels`)."""
        check_supported(model)
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, not {weight_format!r}")
        if (weight_format == "gguf") != (gguf is not None):
            raise ValueError("the gguf weight format runs a GGUF file's blocks: pass the file's GgufWeights with it")
        self.model = model
        self.weight_format = weight_format
        # transformers' modules, read by name (their types say Tensor | Module for any attribute).
        config: Any = model.config
        base: Any = model.model
        p: torch.Tensor = base.embed_tokens.weight
        self.device: torch.device = p.device
        # int4 and the engine's kernels quantize only the matmuls (float32 elsewhere: with bfloat16 activations
        # throughout, the 135M model's greedy answers changed within the first tokens); torch's int8 kernel runs
        # in bfloat16 throughout (set below, where the engine's kernels do not run int8).
        self.dtype: torch.dtype = p.dtype
        attn0 = base.layers[0].self_attn
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn0, "head_dim", config.hidden_size // self.num_heads))
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = float(getattr(attn0, "scaling", self.head_dim ** -0.5))
        self.hidden = int(config.hidden_size)
        self.num_layers = len(base.layers)
        self.max_positions = max(int(context_window), int(getattr(config, "max_position_embeddings", 0) or 0))
        if self.max_positions <= 0:
            raise UnsupportedModel("the model config has no max_position_embeddings")
        self.final_norm = base.norm.weight
        self.final_eps = float(getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", 1e-6)))
        module_names = {id(m): n for n, m in model.named_modules()}
        self.gguf_formats: dict[str, set[str]] = {}  # part -> "TYPE as N-bit groups" (or "as floats"), under gguf

        def grids(part: str, modules: Sequence[nn.Module]) -> list[GroupGrid | None]:
            if gguf is None:
                return []
            found, kinds = [], []
            for m in modules:
                name = module_names[id(m)]
                tensor = gguf.tensor(name)
                grid = gguf.grid(name)
                if tensor is None or (grid is None and part != "head"):
                    raise UnsupportedModel(f"{gguf.path.name}: {name} is "
                                           f"{'missing' if tensor is None else tensor.kind.name} among quantized "
                                           "linear weights (a file that mixes float and quantized layers is not "
                                           "served; --llm-dtype float32 runs it de-quantized)")
                found.append(grid)
                kinds.append(tensor.kind.name)
            # The width the matrix runs in: a fused one's parts all in the widest of theirs (gguf_weights.stacked),
            # so a Q5_0 query beside a Q8_0 value runs in 8 bits and is said to.
            widths = [g.bits for g in found if g is not None]
            how = f"as {max(widths)}-bit groups" if widths else "as floats"
            self.gguf_formats.setdefault(part, set()).update(f"{kind} {how}" for kind in kinds)
            return found

        head: Any = model.lm_head
        self.lm_head_bias: torch.Tensor | None = getattr(head, "bias", None)
        # Under gguf the head multiplies the file's own blocks (its output.weight, or tied, its embedding) where
        # they are blocks: no float copy of it is made.
        head_grids: list[GroupGrid | None] = []
        if gguf is not None and int(head.out_features) % q4_matmul.TILE == 0:
            head_grids = grids("head", [head if gguf.tensor(module_names[id(head)]) is not None
                                        else base.embed_tokens])
        self.lm_head_t: torch.Tensor | None = None
        if head_grids and head_grids[0] is not None:
            self.vocab_size = int(head.out_features)
        else:
            # lm_head as a transposed [hidden, vocab] matrix too: for 4-8 rows the NN GEMM took half the time
            # of F.linear's (18 vs 35 ms for 8 rows on one core). A tied input embedding follows it (a row
            # lookup in the transposed view is a strided gather: negligible next to a step).
            if getattr(head, "_lean_fused", None) is None:
                tied = base.embed_tokens.weight is head.weight
                with torch.no_grad():
                    w_t = head.weight.data.t().contiguous()
                param = nn.Parameter(w_t.t(), requires_grad=False)
                head.weight = param
                if tied:
                    base.embed_tokens.weight = param
                head._lean_fused = (w_t, None)
            self.lm_head_t = head._lean_fused[0]
            self.vocab_size = int(self.lm_head_t.shape[1])
        self.embed: torch.Tensor = base.embed_tokens.weight
        linears = [m for layer in base.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        def choose() -> KernelPaths:
            return KernelPaths.choose(kernels, kernel_dir, device=self.device, weight_format=weight_format,
                                      dtype=self.dtype, head_dim=self.head_dim, hidden=self.hidden,
                                      vocab_size=self.vocab_size, out_features=[m.out_features for m in linears])

        paths = choose()
        if weight_format == "int8" and paths.int4_lib is None:
            self.dtype = torch.bfloat16
            paths = choose()
        self.kernels, self.int4_kernel = paths.kernels, paths.int4_kernel
        self._int4_lib, self._head_lib, self._attention_lib = paths.int4_lib, paths.head_lib, paths.attention_lib
        self.decode_attention = "kernel" if self._attention_lib is not None else "sdpa"
        # int4 keeps its KV in float16 where that kernel reads it (llama.cpp's default too): half the
        # memory of the pool and of the prefix cache's budget per token. (It made no step faster.)
        self.kv_dtype = (torch.float16 if self._attention_lib is not None and (
            weight_format in ("int4", "gguf") or self._int4_lib is not None) else self.dtype)
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in base.layers:
                at, mlp = layer.self_attn, layer.mlp
                L = _Layer()
                L.ln1 = layer.input_layernorm.weight.to(self.dtype)
                L.eps1 = float(getattr(layer.input_layernorm, "variance_epsilon", 1e-6))
                L.ln2 = layer.post_attention_layernorm.weight.to(self.dtype)
                L.eps2 = float(getattr(layer.post_attention_layernorm, "variance_epsilon", 1e-6))
                qkv, gate_up = [at.q_proj, at.k_proj, at.v_proj], [mlp.gate_proj, mlp.up_proj]
                # Under gguf the file's blocks are multiplied, not the model's float weights: only the biases fuse.
                fuse = _fuse_bias if gguf is not None else _fuse_linear
                L.qkv = paths.prepare(fuse(qkv), grids=grids("qkv", qkv))
                L.o = paths.prepare(fuse([at.o_proj]), grids=grids("o", [at.o_proj]))
                L.gu = paths.prepare(fuse(gate_up), grids=grids("gate_up", gate_up))
                L.down = paths.prepare(fuse([mlp.down_proj]), grids=grids("down", [mlp.down_proj]))
                L.act = mlp.act_fn
                self.layers.append(L)
            self.final_norm = self.final_norm.to(self.dtype)
            self.head = paths.prepare((self.lm_head_t, self.lm_head_bias), head=True, grids=head_grids)
            # cos/sin for every position, from the model's own rotary module (so rope scaling is its own).
            # rotate_half(x) * sin == roll(x, d/2) * [-sin_lo, sin_hi]: one op fewer per layer.
            pos = torch.arange(self.max_positions, device=self.device).unsqueeze(0)
            cos, sin = base.rotary_emb(self.embed[:1].unsqueeze(0), pos)
            self.cos = cos[0].to(self.dtype).contiguous()
            sin = sin[0].to(self.dtype)
            half = self.head_dim // 2
            self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous()
        self._fp64 = self.dtype == torch.float64
        self.sdpa = SdpaAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.scaling, self.dtype, self.device)
        # Logits leave the forward in float32, or float64 for a float64 model: rounding them to float32
        # would put a float32 unit (6e-8 of a logit) on differences that float64 keeps at 1e-16, so a
        # float64 comparison could no longer tell a defect from a kernel chosen by the number of rows.
        self.logits_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self._silu_mlp = getattr(config, "hidden_act", None) in ("silu", "swish")
        # A step's layers in one C call where every part of them runs on the engine's kernels
        # (layer_stack.py); the loop in forward() otherwise.
        self._stack: LayerStack | None = None
        if self._int4_lib is not None and self._attention_lib is not None and self._silu_mlp:
            self._stack = LayerStack(
                self._int4_lib, [LayerWeights(qkv=L.qkv[1:], o=L.o[1:], gate_up=L.gu[1:], down=L.down[1:],
                                   ln1=L.ln1, eps1=L.eps1, ln2=L.ln2, eps2=L.eps2) for L in self.layers],
                heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim, cos=self.cos,
                sin_signed=self.sin_signed, scale=self.scaling)
        self._lin = {"native": _lin_native, "int8": _lin_int4_kernel if self._int4_lib is not None else _lin_int8,
                     "gguf": _lin_int4_kernel,
                     "int4": _lin_int4_kernel if self._int4_lib is not None else _lin_int4}[weight_format]
        if weight_format == "gguf":
            self._lin_head = _lin_int4_kernel if len(self.head) == 4 else _lin_native
        else:
            self._lin_head = _lin_native if weight_format == "native" else (
                _lin_q8_kernel if self._head_lib is not None else _lin_w8a8 if self.device.type == "cpu" else _lin_int8)
        self._cast_embed = self.embed.dtype != self.dtype
        if weight_format != "native":
            try:  # fail at load time, not in the first step, where the kernel is missing
                probe = torch.zeros(1, self.hidden, dtype=self.dtype, device=self.device)
                self._lin(probe, self.layers[0].o)
                self._lin_head(probe, self.head)
            except Exception as exc:  # pragma: no cover - depends on the torch build/device
                raise UnsupportedModel(f"{weight_format} weights are not supported on {self.device}: {exc}") from exc

    def release_model_weights(self) -> int:
        """Free the model's own float copies of its layers' linear weights, which a quantized forward
        never reads (it multiplies its int4 or int8 copies): 424 MB of float32 for the embedded model,
        a fifth of the gateway's memory. The modules are left with empty weights, so ``generate()`` and
        new forwards of the model stop working; this forward does not change. For a process that only
        ever runs this forward (the gateway). Returns the bytes freed."""
        if self.weight_format == "native":
            raise ValueError("a native forward multiplies the model's own weights")
        cache = getattr(self.model, "_lean_forward", {})
        if any(f is not self and f.weight_format == "native" for f in cache.values()):
            raise ValueError("a native forward of this model still multiplies its weights")
        freed = 0
        fused_seen: set[int] = set()
        base: Any = self.model.model
        linears = [m for layer in base.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        head: Any = self.model.lm_head
        if self.lm_head_t is None and head.weight is not base.embed_tokens.weight:
            linears.append(head)  # under gguf a head that runs from the file's blocks
        for m in linears:
            fused = getattr(m, "_lean_fused", None)
            if fused is not None and id(fused[0]) not in fused_seen:
                fused_seen.add(id(fused[0]))
                freed += fused[0].numel() * fused[0].element_size()
            elif fused is None:
                freed += m.weight.numel() * m.weight.element_size()
            setattr(m, "_lean_fused", None)  # noqa: B010
            m.weight = nn.Parameter(m.weight.new_empty(0), requires_grad=False)
        setattr(self.model, "_lean_released", True)  # noqa: B010
        return_freed_memory()
        return freed

    def describe(self) -> dict[str, str]:
        """What each part of a step runs on, for /healthz, the log and the benchmarks' JSON, so that a
        slower path is never taken silently: the instruction sets this CPU runs the engine's kernels
        with (``cpu_isas``), the build in use (``kernels``), and per part ``vnni`` / ``avx2`` (that
        build of the engine's kernels), ``torch`` or ``onednn`` (torch's own kernels) or ``sdpa``."""
        if self._head_lib is not None or self._lin_head is _lin_int4_kernel:
            head = self.kernels
        else:
            head = "onednn" if self._lin_head is _lin_w8a8 else "torch"
        described = {
            "device": self.device.type,
            "cpu_isas": ",".join(cpu_kernels.supported_isas()) or "none",
            "kernels": self.kernels,
            "weights": self.weight_format,
            "matmul": self.int4_kernel or "torch",
            "attention": self.kernels if self._attention_lib is not None else "sdpa",
            "head": head,
            "layers_in_one_call": str(self._stack is not None).lower(),
        }
        if self.weight_format == "int8":
            described["int8"] = ("8-bit groups of 32" if self._int4_lib is not None
                                 else "per output channel, bfloat16")
        if self.device.type == "cpu" and self.dtype == torch.bfloat16:
            described["bfloat16"] = ("native" if cpu_kernels.has_bfloat16_instructions() else
                                     "emulated: this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16), so "
                                     "each step is many times slower than float32 or int4")
        # Under gguf, per part which of the file's types runs in which format ("Q5_0 as 5-bit groups").
        for part, formats in self.gguf_formats.items():
            described[f"gguf_{part}"] = ", ".join(sorted(formats))
        return described

    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    @property
    def kv_layout(self) -> KVLayout:
        """What the KV of a token of this forward looks like (the KV manager allocates by it)."""
        from .kv_manager import KVLayout

        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype, self.device,
                        self.max_positions)

    # -- the step -------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm in one kernel: F.rms_norm with the weight, in the activations' dtype (it sums in
        float32; LlamaRMSNorm casts back before the weight, one rounding more in bfloat16, and three
        kernels more). float64 normalizes in float32 as LlamaRMSNorm does: the float64 tests compare
        with transformers' forward to 1e-9."""
        if not self._fp64:
            return F.rms_norm(x, (self.hidden,), w, eps)
        return w * F.rms_norm(x.float(), (self.hidden,), None, eps).to(self.dtype)

    def _residual_add(self, x: torch.Tensor, inp: torch.Tensor, weights: tuple) -> torch.Tensor:
        """``x += lin(inp)`` in place: for native weights one GEMM that adds into ``x`` (addmm_), the
        stream's own tensor in decode_static."""
        if self.weight_format == "native":
            w_t, b = weights
            x.addmm_(inp, w_t)
            return x if b is None else x.add_(b)
        return x.add_(self._lin(inp, weights))

    def _lin_into(self, inp: torch.Tensor, weights: tuple, out: torch.Tensor) -> None:
        """``out[:] = lin(inp)``: for native weights the GEMM writes ``out`` itself (a view whose rows
        are strided), a copy otherwise."""
        if self.weight_format == "native":
            w_t, b = weights
            if b is None:
                torch.mm(inp, w_t, out=out)
            else:
                torch.addmm(b, inp, w_t, out=out)
        else:
            out.copy_(self._lin(inp, weights))

    def _norm_lin(self, x: torch.Tensor, w: torch.Tensor, eps: float, weights: tuple) -> torch.Tensor:
        """``lin(rms_norm(x))``; the VNNI kernel normalizes the rows as it quantizes them."""
        if self._int4_lib is not None:
            return _lin_int4_kernel(x, weights, norm=(w, eps))
        return self._lin(self._norm(x, w, eps), weights)

    def _residual_lin(self, x: torch.Tensor, inp: torch.Tensor, weights: tuple, gate: nn.Module | None = None
                      ) -> torch.Tensor:
        """``x + lin(inp)``, or with ``gate``, ``x + lin(gate(inp[:, :i]) * inp[:, i:])`` (a gated MLP's
        down projection). The VNNI kernel gates a SiLU MLP's rows as it quantizes them and adds its
        product to ``x`` in place (``x`` is the step's own residual stream)."""
        if self._int4_lib is not None and (gate is None or self._silu_mlp):
            return _lin_int4_kernel(inp, weights, gated=gate is not None, add_to=x)
        if gate is not None:
            inter = inp.shape[1] // 2
            inp = gate(inp[:, :inter]).mul_(inp[:, inter:])
        return x + self._lin(inp, weights)

    @torch.inference_mode()
    def forward(
        self,
        pool: KVPool,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: Sequence[Segment],
        logit_rows: Sequence[int] | torch.Tensor,
    ) -> torch.Tensor:
        """Run one step over ``T`` new tokens and return the logits of ``logit_rows`` (float32; float64
        for a float64 model: ``logits_dtype``).

        ``token_ids``/``positions`` (``[T]``, on the model's device) list the new tokens segment by
        segment. Single-token segments (decoding) come first, in increasing slot order; prompt chunks
        (``n > 1``) follow. Each segment's keys/values are written to its slot of ``pool`` (its capacity
        must suffice: :meth:`KVPool.ensure_capacity`), and the slot lengths are updated at the end, so a
        step that raises commits nothing and can be retried.
        """
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        T = token_ids.shape[0]
        data = pool.data
        if data is None:
            raise ValueError("the pool has no KV tensor (no slot was ever acquired)")
        n_dec = 0
        while n_dec < len(segments) and segments[n_dec].n == 1:
            n_dec += 1
        dec = segments[:n_dec]
        chunks = segments[n_dec:]
        dec_slots = [s.slot for s in dec]
        if any(b <= a for a, b in zip(dec_slots, dec_slots[1:])):
            raise ValueError("single-token segments must come first, in increasing slot order")
        if any(s.n < 1 for s in chunks):
            raise ValueError("empty segment")
        if n_dec + sum(s.n for s in chunks) != T:
            raise ValueError(f"segments cover {n_dec + sum(s.n for s in chunks)} rows, got {T} tokens")
        kernel = self._attention_lib
        if kernel is not None:
            # Every row, decoding or prompt, attends on the kernel over its own slot up to its own
            # position (a prompt row sees the rows of its chunk before it: the kernel stores them all
            # first). So a row's result is the same whatever else the step holds, and a prompt's
            # chunks need no masks.
            row_slots = torch.tensor(dec_slots + [s.slot for s in chunks for _ in range(s.n)], dtype=torch.long)
        else:
            plan = self.sdpa.plan(pool, dec, chunks, positions)

        x = F.embedding(token_ids, self.embed)
        if self._cast_embed:
            x = x.to(self.dtype)
        if kernel is None:
            cos = self.cos.index_select(0, positions).unsqueeze(1)
            sin = self.sin_signed.index_select(0, positions).unsqueeze(1)
        if self._stack is not None:
            self._stack.run(x, data, row_slots, positions)
        else:
            for li, L in enumerate(self.layers):
                qkv = self._norm_lin(x, L.ln1, L.eps1, L.qkv).view(T, H + 2 * KVH, D)
                layer = data[li]  # [2, slots, KVH, cap, D]
                if kernel is not None:
                    # The kernel rotates the queries and keys itself (torch's roll, products and sum had cost
                    # a step 0.35-0.4 ms, for one row as for eight).
                    att = decode_attention.attend(kernel, qkv, H, KVH, layer, row_slots, positions, self.scaling,
                                                  rope=(self.cos, self.sin_signed))
                else:
                    qk = qkv[:, : H + KVH]
                    rot = torch.roll(qk, D // 2, -1).mul_(sin)
                    qk.mul_(cos).add_(rot)
                    att = self.sdpa.attend(layer, qkv, plan)
                x = self._residual_lin(x, att, L.o)
                gu = self._norm_lin(x, L.ln2, L.eps2, L.gu)
                x = self._residual_lin(x, gu, L.down, gate=L.act)
        for s in segments:
            pool.commit(s.slot, s.start + s.n)
        if isinstance(logit_rows, torch.Tensor):
            rows = logit_rows
        else:
            if len(logit_rows) == 0:
                return torch.empty((0, self.vocab_size), dtype=self.logits_dtype, device=self.device)
            rows = torch.tensor(list(logit_rows), dtype=torch.long, device=self.device)
        hs = self._norm(x.index_select(0, rows), self.final_norm, self.final_eps)
        logits = self._lin_head(hs, self.head)
        return logits.to(self.logits_dtype)

    @torch.inference_mode()
    def decode_static(self, kv: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                      write_slots: torch.Tensor, seq_lens: torch.Tensor, length: int,
                      out: torch.Tensor | None = None) -> torch.Tensor:
        """One decoding step of ``B`` rows over inputs of fixed shapes, so that it can be captured as a
        CUDA graph and replayed (``model_runner.py``); on torch's kernels and sdpa only.

        Row ``i`` is slot ``i``: it attends positions ``[0, length)`` of that slot, masked to its first
        ``seq_lens[i]``, after its new key and value are stored at ``positions[i]`` of
        ``write_slots[i]`` (a padding row writes the pool's scratch slot and reads one position).
        Nothing reads a host value, and every shape depends only on ``(B, length)``. ``kv`` is the
        pool's tensor; positions ``[0, length)`` of slots ``0..B-1`` must hold finite numbers. Returns
        logits ``[B, vocab]`` in ``logits_dtype`` (written into ``out`` where given: every graph of a batch
        bucket writes the one buffer the device sampler's graph reads); the caller records the slots' new
        lengths."""
        if self._attention_lib is not None:
            raise ValueError("decode_static runs on sdpa; this forward attends on the engine's kernels")
        H, KVH, D, G = self.num_heads, self.num_kv_heads, self.head_dim, self.groups
        B = token_ids.shape[0]
        x = F.embedding(token_ids, self.embed)
        if self._cast_embed:
            x = x.to(self.dtype)
        # Every launch counts in a replayed graph (tests/engine/test_model_runner.py bounds them per layer),
        # so a layer runs the forward's arithmetic in 11 kernels instead of 22: each RMSNorm one kernel
        # (_norm), RoPE one batched matmul by each row's rotation (built here once a step: cos on the
        # diagonal, the signed sin D/2 off it, as torch.roll placed it), the key and the value stored by
        # one indexed write, and the residual adds inside the GEMMs (addmm_ into the stream).
        rot = torch.diag_embed(self.cos.index_select(0, positions))
        rot.add_(torch.diag_embed(self.sin_signed.index_select(0, positions)).roll(D // 2, -2))
        keep = torch.arange(length, device=self.device).unsqueeze(0) < seq_lens.unsqueeze(1)
        mask = self.sdpa.additive(keep).view(B, 1, 1, length)
        # One buffer a row holds the rotated queries and keys, then the qkv GEMM's output, written in
        # place (out=): the rotated keys (head H) and the values (head 2H + 2KVH) then lie a fixed
        # stride apart in every row, so that one strided view of both, [B, 2, KVH, D], is stored with
        # one indexed write (the pool's layer is [2, slots + 1, KVH, cap, D]).
        rotated, T = H + KVH, H + 2 * KVH
        z = torch.empty((B, rotated + T, D), dtype=self.dtype, device=self.device)
        qkv_out = z.as_strided((B, T * D), (z.stride(0), 1), rotated * D)
        new_kv = z.as_strided((B, 2, KVH, D), (z.stride(0), (H + 2 * KVH) * D, D, 1), H * D)
        q = z[:, :H].view(B, KVH, G, D)
        for li, L in enumerate(self.layers):
            self._lin_into(self._norm(x, L.ln1, L.eps1), L.qkv, qkv_out)
            torch.bmm(z[:, rotated : 2 * rotated], rot, out=z[:, :rotated])
            layer = kv[li]  # [2, slots + 1, KVH, cap, D]
            layer[:, write_slots, :, positions] = new_kv
            o = F.scaled_dot_product_attention(q, layer[0, :B, :, :length], layer[1, :B, :, :length],
                                               attn_mask=mask, scale=self.scaling)
            x = self._residual_add(x, o.reshape(B, H * D), L.o)
            gu = self._lin(self._norm(x, L.ln2, L.eps2), L.gu)
            inter = gu.shape[1] // 2
            x = self._residual_add(x, L.act(gu[:, :inter]).mul_(gu[:, inter:]), L.down)
        hs = self._norm(x, self.final_norm, self.final_eps)
        if out is None:
            return self._lin_head(hs, self.head).to(self.logits_dtype)
        if self.weight_format == "native" and self.dtype == self.logits_dtype:
            self._lin_into(hs, self.head, out)  # the GEMM writes the buffer itself
        else:
            out.copy_(self._lin_head(hs, self.head))  # the cast to logits_dtype is the copy
        return out
