"""The int4 GEMMs of all the embedded model's layers on both kernels, in one run; prints JSON.

    python -m benchmarks.int4_kernels [--rows 1 8 64 256] [--repeats 20]

For each row count, the 30 layers' four fused matmuls (qkv, o, gate+up, down) of one decoding or
prefill step run on the VNNI kernel (``inference/llm/q4_vnni.c``) and on torch's
``_weight_int4pack_mm_for_cpu``, alternately, with the model's own Q4_1 weights; the figures are the
medians of ``--repeats`` passes, and ``ratio`` is torch's time over the VNNI kernel's. It also
reports each kernel's error against a float64 product on one layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from inference.llm import cpu_kernels, q4_vnni
from inference.llm.forward import INT4_GROUP, _int4_grid, _lin_int4, _quantize_int4, _quantize_int4_vnni
from inference.llm.loader import load_lm
from inference.models import embedded_llm


def layer_matrices(model) -> list[torch.Tensor]:
    """Each layer's fused [in, out] matrices, as the engine fuses them."""
    out = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        for group in ((at.q_proj, at.k_proj, at.v_proj), (at.o_proj,), (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)):
            out.append(torch.cat([m.weight.data for m in group], dim=0).t().contiguous())
    return out


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway")
    args = ap.parse_args(argv)
    cache_dir = Path(args.cache_dir).expanduser()
    lib = cpu_kernels.load(cache_dir)
    if lib is None:
        print(json.dumps({"error": "the VNNI kernel cannot run here (see the log)"}))
        sys.exit(1)
    lm = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="float32")
    matrices = layer_matrices(lm.model)
    vnni = [_quantize_int4_vnni(w, None, lib) for w in matrices]
    theirs = [_quantize_int4(w, None, torch.bfloat16) for w in matrices]
    report: dict = {"threads": torch.get_num_threads(), "matrices": len(matrices), "ms_per_step": {}}
    for rows in args.rows:
        inputs = [torch.randn(rows, w.shape[0]) for w in matrices]
        inputs_bf16 = [x.to(torch.bfloat16) for x in inputs]

        def run_vnni(inputs: list[torch.Tensor] = inputs) -> None:
            for x, (_, blob, n, _) in zip(inputs, vnni):
                q4_vnni.matmul(lib, x, blob, n)

        def run_torch(inputs_bf16: list[torch.Tensor] = inputs_bf16) -> None:
            for x, (packed, scales, _) in zip(inputs_bf16, theirs):
                torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales)

        ours, torchs = [], []
        for _ in range(3):  # alternate, so both see the same machine load
            ours.append(timed(run_vnni, max(1, args.repeats // 3)))
            torchs.append(timed(run_torch, max(1, args.repeats // 3)))
        a, b = statistics.median(ours) * 1000, statistics.median(torchs) * 1000
        report["ms_per_step"][str(rows)] = {"vnni": round(a, 2), "torch": round(b, 2), "ratio": round(b / a, 2)}
    w = matrices[3]  # layer 0's down projection
    low, step, q = _int4_grid(w)
    exact_w = (torch.round(q) * step[..., None] + low[..., None]).reshape(w.shape[1], -1).t().double()
    x = torch.randn(8, w.shape[0])
    exact = x.double() @ exact_w
    for name, y in (("vnni", q4_vnni.matmul(lib, x, vnni[3][1], w.shape[1])), ("torch", _lin_int4(x, theirs[3]))):
        report.setdefault("relative_error_vs_float64", {})[name] = float((y.double() - exact).norm() / exact.norm())
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
