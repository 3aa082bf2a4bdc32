"""Which build of the engine's C kernels (``--llm-kernels``) runs which part of a forward, chosen once at
load: int4 matmuls, the 8-bit output head and attention each on the build this CPU runs, or torch's kernels
where none runs; a build asked for by name that cannot run this model is an error, never a silent
fall-back. :meth:`KernelPaths.prepare` lays each weight out for what will multiply it (weight_formats.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import cpu_kernels, decode_attention, q4_matmul, q8_matmul
from .gguf_blocks import GroupGrid
from .gguf_weights import stacked
from .model_support import UnsupportedModel
from .weight_formats import (
    INT4_GROUP,
    quantize_int4,
    quantize_int4_kernel,
    quantize_int8,
    quantize_int8_kernel,
    quantize_q8_kernel,
    quantize_w8a8,
)

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
        # on oneDNN (lin_w8a8).
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
            return quantize_int8_kernel(w_t, b, self.int4_lib)
        if self.weight_format == "int4" and not head:
            if self.device.type != "cpu" or w_t.shape[0] % INT4_GROUP:
                raise UnsupportedModel(f"int4 weights need the CPU and inputs in groups of {INT4_GROUP}")
            if self.int4_lib is not None:
                return quantize_int4_kernel(w_t, b, self.int4_lib)
            try:
                return quantize_int4(w_t, b, torch.bfloat16)
            except RuntimeError as exc:  # pragma: no cover - shapes the packing kernel does not take
                raise UnsupportedModel(f"int4 weights are not supported for a {tuple(w_t.shape)} matrix: {exc}") from exc
        if head and self.weight_format != "native" and self.device.type == "cpu":
            # The output head stays 8-bit under int4: a tied embedding (Q8_0 in a GGUF) loses too much at 4 bits.
            if self.head_lib is not None:
                return quantize_q8_kernel(w_t, b, self.head_lib)
            return quantize_w8a8(w_t, b)
        if self.weight_format != "native":
            return quantize_int8(w_t, b, torch.bfloat16)
        return (w_t, b)
