"""Single-stream (and 8-stream) speed of the engine's options, measured interleaved in one run; prints JSON.

    python -m benchmarks.engine_options [--tokens 48] [--repeats 3]

Options: weights float32 (exact: generate()'s tokens), bfloat16, int8 (weight-only, bfloat16
activations), int4 (the Q4_1 weights in 4-bit groups on the VNNI kernel where the CPU has it, float32
elsewhere);
intra-op threads 1, 2 or adaptive. Each repeat runs every option once, back to back, so
they see the same machine load; the figures are medians. One engine runs at a time and generate()
on a short-lived thread: two live OpenMP pools would throttle each other (inference/llm/threads.py).
"agreement" is how many leading greedy tokens of each option equal float32 ``generate()``'s, over a
few prompts.

torch.compile was tried on the two dense halves of a layer (norm+qkv+rope, o_proj+norm+MLP): 34 s to
compile, and no faster than eager for 1 row (the GEMMs dominate and stay MKL calls), so it is not used.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine import greedy_reference, leading_agreement, measure_decode, render, running
from inference.llm.backend import SamplingParams
from inference.llm.engine import LLMEngine
from inference.llm.loader import LoadedLM, load_lm
from inference.llm.threads import run_in_own_thread
from inference.models import embedded_llm

PROMPTS = [
    "Write a long story about a dragon and a knight.",
    "What is the capital of France?",
    "Explain how a bicycle works.",
    "Tell me about Paris.",
]
GREEDY = dict(temperature=0, repetition_penalty=1.0)


def ids_for(lm: LoadedLM, question: str) -> list[int]:
    return render(lm, [{"role": "user", "content": question}])


async def decode_rate(lm: LoadedLM, threads: int, tokens: int) -> float:
    params = SamplingParams(**GREEDY, max_tokens=tokens, ignore_eos=True)
    return (await measure_decode(lm, ids_for(lm, PROMPTS[0]), params, threads))[1]


async def aggregate_rate(lm: LoadedLM, streams: int, tokens: int) -> float:
    params = SamplingParams(**GREEDY, max_tokens=tokens, ignore_eos=True)
    prompts = [ids_for(lm, f"{PROMPTS[i % len(PROMPTS)]} Version {i}.") for i in range(streams)]
    async with running(LLMEngine(lm)) as engine:
        await engine.submit(prompts[0], params).result()  # warm-up
        engine.clear_prefix_cache()
        t0 = time.monotonic()
        results = [await s.result() for s in [engine.submit(p, params) for p in prompts]]
    return sum(r.completion_tokens for r in results) / (max(r.finished_at for r in results) - t0)


async def agreement(lm: LoadedLM, references: list[list[int]], tokens: int) -> list[str]:
    out = []
    async with running(LLMEngine(lm)) as engine:
        for question, ref in zip(PROMPTS, references):
            r = await engine.submit(ids_for(lm, question), SamplingParams(**GREEDY, max_tokens=tokens)).result()
            out.append(leading_agreement(ref, r.token_ids))
    return out


async def main_async(args) -> dict:
    cache_dir = Path(args.cache_dir).expanduser()
    fp32 = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="float32")
    bf16 = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="bfloat16")
    formats = {
        "float32": fp32,
        "bfloat16": bf16,
        "int8": dataclasses.replace(fp32, weight_format="int8"),
        "int4": dataclasses.replace(fp32, weight_format="int4"),
    }
    reference = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="float32")  # never re-laid by an engine
    max_threads = torch.get_num_threads()
    configs: dict[str, tuple[LoadedLM, int]] = {}
    for name, lm in formats.items():
        for threads in sorted({1, max_threads}) + [0]:
            if threads == 0 and name != "float32":
                continue
            configs[f"{name}/threads={'adaptive' if threads == 0 else threads}"] = (lm, threads)
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.repeats):
        for label, (lm, threads) in configs.items():
            rates[label].append(await decode_rate(lm, threads, args.tokens))
    agg: dict[str, dict[str, float]] = {}
    for name, lm in formats.items():
        one = [await aggregate_rate(lm, 1, args.tokens) for _ in range(2)]
        eight = [await aggregate_rate(lm, 8, args.tokens) for _ in range(2)]
        agg[name] = {"1_stream_tok_s": round(max(one), 2), "8_streams_tok_s": round(max(eight), 2),
                     "ratio": round(max(eight) / max(one), 2)}
    references = [await run_in_own_thread(greedy_reference, reference, ids_for(reference, q), 24) for q in PROMPTS]
    agree = {name: await agreement(lm, references, 24) for name, lm in formats.items()}
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tokens": args.tokens,
        "single_stream_decode_tok_s_median": {k: round(statistics.median(v), 2) for k, v in rates.items()},
        "single_stream_decode_tok_s_all": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "aggregate_adaptive_threads": agg,
        "greedy_agreement_with_float32_generate": agree,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
