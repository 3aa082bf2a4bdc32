"""The int4 GEMMs of all the embedded model's layers on the engine's kernel builds and on torch's, in one
run; prints JSON.

    python -m benchmarks.int4_kernels [--isa vnni avx2] [--rows 1 8 64 256] [--repeats 20]

For each row count, the 30 layers' four fused matmuls (qkv, o, gate+up, down) of one decoding or
prefill step run on each build of the engine's kernel (``inference/llm/q4_matmul.c``, ``--isa``: by
default every build this CPU runs) and on torch's ``_weight_int4pack_mm_for_cpu``, alternately, with
the model's own Q4_1 weights; the figures are the medians of ``--repeats`` passes, and
``torch_over_<isa>`` is torch's time over that build's. The output head (49152 x 576, int8) runs the
same way on each build's ``q8_matmul.c`` and on oneDNN (``head_ms``). It also reports each kernel's
error against a float64 product on one layer. The AVX2 build runs on any x86-64 CPU with AVX2, FMA
and F16C, so on an AVX512-VNNI machine both builds can be timed side by side (the AVX2 figures then
stand in for a CPU without AVX512; they are not that CPU's).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from inference.llm import cpu_kernels, q4_matmul, q8_matmul
from inference.llm.loader import load_lm
from inference.llm.weight_formats import (
    INT4_GROUP,
    int4_grid,
    lin_int4,
    lin_w8a8,
    quantize_int4,
    quantize_int8,
    quantize_w8a8,
)
from inference.models import embedded_llm


def layer_matrices(model) -> list[torch.Tensor]:
    """Each layer's fused [in, out] matrices, as the engine fuses them."""
    out = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        for group in ((at.q_proj, at.k_proj, at.v_proj), (at.o_proj,), (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)):
            out.append(torch.cat([m.weight.data for m in group], dim=0).t().contiguous())
    return out


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def alternated(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each run's median time in ms, the runs taking turns (3 rounds), so all see the same machine load."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):
        for name, fn in runs.items():
            samples[name].append(timed(fn, max(1, repeats // 3)))
    return {name: round(statistics.median(s) * 1000, 2) for name, s in samples.items()}


def kernel_step(lib: ctypes.CDLL, inputs: list[torch.Tensor], blobs: list[tuple[torch.Tensor, int]]) -> None:
    for x, (blob, n) in zip(inputs, blobs):
        q4_matmul.matmul(lib, x, blob, n)


def torch_step(inputs_bf16: list[torch.Tensor], packed: list[tuple]) -> None:
    for x, (weights, scales, _) in zip(inputs_bf16, packed):
        torch.ops.aten._weight_int4pack_mm_for_cpu(x, weights, INT4_GROUP, scales)


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", nargs="+", choices=cpu_kernels.ISAS, default=None,
                    help="builds of the engine's kernels to time (default: every one this CPU runs)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway")
    args = ap.parse_args(argv)
    cache_dir = Path(args.cache_dir).expanduser()
    isas = args.isa or list(cpu_kernels.supported_isas())
    libs: dict[str, ctypes.CDLL] = {}
    for isa in isas:
        lib = cpu_kernels.load(cache_dir, isa)
        if lib is None:
            print(json.dumps({"error": f"the {isa} build cannot run here (see the log)"}))
            sys.exit(1)
        libs[isa] = lib
    lm = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="float32")
    matrices = layer_matrices(lm.model)
    blobs = []
    for w in matrices:
        low, step, q = int4_grid(w)
        blobs.append((q4_matmul.pack(step, low, torch.round(q).clamp_(0, 15)), w.shape[1]))
    theirs = [quantize_int4(w, None, torch.bfloat16) for w in matrices]
    head_t = lm.model.lm_head.weight.data.t().contiguous()
    head_q, head_scale, _ = quantize_int8(head_t, None, torch.float32)
    head_blob, head_onednn = q8_matmul.pack(head_q), quantize_w8a8(head_t, None)
    report: dict = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "matrices": len(matrices),
                    "ms_per_step": {}, "head_ms": {}}
    for rows in args.rows:
        inputs = [torch.randn(rows, w.shape[0]) for w in matrices]
        runs: dict[str, Callable[[], None]] = {isa: partial(kernel_step, lib, inputs, blobs) for isa, lib in libs.items()}
        runs["torch"] = partial(torch_step, [x.to(torch.bfloat16) for x in inputs], theirs)
        times = alternated(runs, args.repeats)
        for isa in libs:
            times[f"torch_over_{isa}"] = round(times["torch"] / times[isa], 2)
        report["ms_per_step"][str(rows)] = times
        x = torch.randn(rows, head_t.shape[0])
        heads: dict[str, Callable[[], object]] = {isa: partial(q8_matmul.matmul, lib, x, head_blob, head_scale)
                                                  for isa, lib in libs.items()}
        heads["onednn"] = partial(lin_w8a8, x, head_onednn)
        report["head_ms"][str(rows)] = alternated(heads, args.repeats)
    w = matrices[3]  # layer 0's down projection
    low, step, q = int4_grid(w)
    exact_w = (torch.round(q) * step[..., None] + low[..., None]).reshape(w.shape[1], -1).t().double()
    x = torch.randn(8, w.shape[0])
    exact = x.double() @ exact_w
    outputs = {isa: q4_matmul.matmul(lib, x, blobs[3][0], w.shape[1]) for isa, lib in libs.items()}
    outputs["torch"] = lin_int4(x, theirs[3])
    report["relative_error_vs_float64"] = {name: float((y.double() - exact).norm() / exact.norm())
                                           for name, y in outputs.items()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
