"""The LLM engine on a GPU, against transformers' own ``generate`` and continuous batching, in one
run; prints JSON.

    python -m benchmarks.gpu [--shape qwen2.5-1.5b] [--device cuda] [--weights random|embedded]

``--weights random`` (the default) builds a model of ``--shape`` (``benchmarks/synthetic_lm.py``:
smollm2-135m, qwen2.5-1.5b, llama-3.2-3b, qwen2.5-7b) with seeded random weights and a byte-level
tokenizer, so that a GPU machine needs no weight file; speed does not depend on the weights' values.
``--weights embedded`` loads the embedded SmolLM2 instead.

1. ``1_ttft``: TTFT of a ~762-token prompt (a system prompt and a question) seen for the first time,
   and of the same system prompt with another question (the prefix cache);
2. ``2_streams``: aggregate tok/s of 1, 8 and 32 concurrent greedy streams (medians of ``--repeats``),
   with each stream's memory bound: the weights read once a step at ``--bandwidth-gbs``;
3. ``3_versus_transformers``: the same 1 and 8 streams on transformers' ``generate`` (8 prompts of equal
   length in one padded batch) and 8 on its ContinuousBatchingManager (``generate_batch``), on an
   identical copy of the model, with the engine's ratio to each;
4. ``4_batched_equals_solo``: each of 8 streams' greedy tokens batched against the same prompt alone:
   how many leading tokens agree (random weights give flat logits, so a near-tie, where rounding may
   pick the other token, comes early; ``tests/engine`` checks the logits themselves).

``paths``: what each part of a step runs on (``decode``: ``cuda-graphs`` on CUDA). ``--device cpu``
runs the same sections on the CPU (the test suite does, with two layers, so that the script stays
working where no GPU is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine import (
    LONG_QUESTIONS,
    bench_system_prompt,
    leading_agreement,
    render,
    run_streams,
    running,
    transformers_batch,
    warm_up,
)
from benchmarks.synthetic_lm import SHAPES, random_loaded_lm
from inference.llm.backend import SamplingParams
from inference.llm.engine import EngineConfig, LLMEngine
from inference.llm.loader import LoadedLM, load_lm
from inference.llm.threads import run_in_own_thread
from inference.models import embedded_llm

H100_SXM_GBS = 3350.0  # HBM3 bandwidth of an H100 SXM (80 GB)
PROMPT_TOKENS = 762


def load_pair(args, cache_dir: Path) -> tuple[LoadedLM, LoadedLM]:
    """The engine's copy and an untouched one for transformers (the engine re-lays its model's weights)."""
    if args.weights == "random":
        return (random_loaded_lm(cache_dir, layers=args.layers, device=args.device, shape=args.shape,
                                 max_positions=4096),
                random_loaded_lm(cache_dir, layers=args.layers, device=args.device, shape=args.shape,
                                 max_positions=4096))
    return (load_lm(embedded_llm(), device=args.device, cache_dir=cache_dir, max_context_tokens=2048),
            load_lm(embedded_llm(), device=args.device, cache_dir=cache_dir, max_context_tokens=2048))


def memory_bound(lm: LoadedLM, bandwidth_gbs: float) -> dict:
    """What reading every weight once a step allows one stream (the KV is extra, and small here)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    per_step_s = weight_bytes / (bandwidth_gbs * 1e9) if bandwidth_gbs > 0 else 0.0
    return {"weight_bytes": weight_bytes, "bandwidth_gbs": bandwidth_gbs,
            "one_stream_tok_s": round(1.0 / per_step_s, 1) if per_step_s else None}


def generate_batch_rate(stock: LoadedLM, prompts: list[list[int]], tokens: int) -> float:
    """transformers' ``generate`` on ``prompts`` in one left-padded batch, greedy, ``tokens`` each: tok/s."""
    width = max(len(p) for p in prompts)
    pad = stock.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=stock.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=stock.device)
    kw = dict(attention_mask=mask, do_sample=False, repetition_penalty=1.0, pad_token_id=pad,
              max_new_tokens=tokens, min_new_tokens=tokens)
    with torch.inference_mode():
        stock.model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=pad, max_new_tokens=2)  # warm-up
        _sync(stock)
        t0 = time.perf_counter()
        stock.model.generate(ids, **kw)
        _sync(stock)
        wall = time.perf_counter() - t0
    return len(prompts) * tokens / wall


def _sync(lm: LoadedLM) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def stream_prompts(lm: LoadedLM, n: int) -> list[list[int]]:
    return [render(lm, [{"role": "user", "content": LONG_QUESTIONS[i % len(LONG_QUESTIONS)]}]) for i in range(n)]


async def bench_streams(engine: LLMEngine, lm: LoadedLM, tokens: int, repeats: int, bound: dict) -> dict:
    out = {}
    for n in (1, 8, 32):
        runs = []
        for _ in range(repeats):
            engine.clear_prefix_cache()
            runs.append(await run_streams(engine, lm, n, tokens))
        best = sorted(runs, key=lambda d: d["aggregate_tok_s"])[len(runs) // 2]
        if bound["one_stream_tok_s"]:
            best["share_of_memory_bound"] = round(best["aggregate_tok_s"] / (n * bound["one_stream_tok_s"]), 3)
        out[f"streams_{n}"] = best
    return out


async def bench_batched_equals_solo(engine: LLMEngine, lm: LoadedLM, tokens: int) -> dict:
    """8 greedy streams together, then each alone: how many leading tokens agree."""
    prompts = stream_prompts(lm, 8)
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    engine.clear_prefix_cache()
    batched = [await s.result() for s in [engine.submit(p, params) for p in prompts]]
    agree = []
    for prompt, together in zip(prompts, batched):
        engine.clear_prefix_cache()
        alone = await engine.submit(prompt, params).result()
        agree.append(leading_agreement(alone.token_ids, together.token_ids))
    return {"leading_tokens_equal": agree,
            "streams_identical": f"{sum(a.split('/')[0] == a.split('/')[1] for a in agree)}/{len(agree)}"}


async def main_async(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="gw-bench-gpu-") as tmp:
        cache_dir = Path(args.cache_dir).expanduser() if args.weights == "embedded" else Path(tmp)
        lm, stock = await run_in_own_thread(load_pair, args, cache_dir)
        report: dict = {"device": args.device, "weights": args.weights, "shape": args.shape,
                        "layers": len(lm.model.model.layers), "dtype": str(lm.dtype).removeprefix("torch.")}
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name()
        bound = memory_bound(lm, args.bandwidth_gbs if args.device.startswith("cuda") else 0.0)
        report["memory_bound"] = bound
        config = EngineConfig(max_batch_size=32, max_queued_requests=64, prefill_chunk_tokens=args.prefill_chunk)
        async with running(LLMEngine(lm, config)) as engine:
            report["paths"] = engine.describe()
            await warm_up(engine, lm)
            report["1_ttft"] = await bench_system_prompt(engine, lm, args.repeats, target_tokens=PROMPT_TOKENS - 20)
            await warm_up(engine, lm)
            report["2_streams"] = await bench_streams(engine, lm, args.tokens, args.repeats, bound)
            report["4_batched_equals_solo"] = await bench_batched_equals_solo(engine, lm, args.tokens)
            report["engine_stats"] = {k: v for k, v in engine.stats().items()
                                      if k in ("cuda_graphs", "graph_replays", "padded_rows", "avg_step_ms")}
        prompts = stream_prompts(lm, 8)
        one = await run_in_own_thread(generate_batch_rate, stock, prompts[:1], args.tokens)
        eight = await run_in_own_thread(generate_batch_rate, stock, prompts, args.tokens)
        cbm = await run_in_own_thread(transformers_batch, stock, prompts, args.tokens)
        streams = report["2_streams"]
        report["3_versus_transformers"] = {
            "generate_1_stream_tok_s": round(one, 2),
            "generate_8_streams_tok_s": round(eight, 2),
            "continuous_batching_8_streams_tok_s": cbm["aggregate_tok_s"],
            "continuous_batching_errors": cbm["errors"],
            "ratio_1_stream_vs_generate": round(streams["streams_1"]["aggregate_tok_s"] / one, 2),
            "ratio_8_streams_vs_generate": round(streams["streams_8"]["aggregate_tok_s"] / eight, 2),
            "ratio_8_streams_vs_continuous_batching": round(
                streams["streams_8"]["aggregate_tok_s"] / max(cbm["aggregate_tok_s"], 1e-9), 2),
            "target": ">= 3 each",
        }
        report["targets"] = TARGETS.get(args.shape, {})
    return report


# The targets on one H100 in bfloat16 (1_ttft in seconds, 2_streams in tok/s).
TARGETS = {
    "qwen2.5-1.5b": {"streams_1": 450, "streams_8": 3000, "streams_32": 8000, "ttft_first_s": 0.020,
                     "ttft_same_system_other_question_s": 0.010},
    "smollm2-135m": {"streams_1": 1000, "streams_8": 5000, "ttft_first_s": 0.012},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--weights", choices=("random", "embedded"), default="random")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="smollm2-135m", help="for --weights random")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of random weights (default: the shape's)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-chunk", type=int, default=2048, help="prompt tokens per engine step")
    ap.add_argument("--bandwidth-gbs", type=float, default=H100_SXM_GBS, help="GPU memory bandwidth for the bound")
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway", help="for --weights embedded")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("torch sees no CUDA device (use --device cpu to run the same sections on the CPU)")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = asyncio.run(main_async(args))
    report["medians_of"] = args.repeats
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
