"""Single-stream (and 8-stream) speed of the engine's options, measured interleaved in one run; prints JSON.

    python -m benchmarks.engine_options [--tokens 48] [--repeats 3]

Options: weights float32 (exact, the default on CPU), bfloat16, int8 (weight-only, bfloat16
activations); intra-op threads 1, 2 or adaptive. Each repeat runs every option once, back to back, so
they see the same machine load; the figures are medians. "agreement" is how many leading greedy tokens
of each option equal float32 ``generate()``'s, over a few prompts.

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

from inference.llm.engine import EngineConfig, LLMEngine, SamplingParams
from inference.llm.loader import LoadedLM, load_lm
from inference.models import embedded_llm

PROMPTS = [
    "Write a long story about a dragon and a knight.",
    "What is the capital of France?",
    "Explain how a bicycle works.",
    "Tell me about Paris.",
]


def render(lm: LoadedLM, q: str) -> list[int]:
    out = lm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)
    return list(out["input_ids"])


async def decode_rate(engine: LLMEngine, ids: list[int], tokens: int) -> float:
    engine.clear_prefix_cache()
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    r = await engine.submit(ids, params).result()
    return (r.completion_tokens - 1) / (r.finished_at - r.first_token_at)


async def aggregate_rate(engine: LLMEngine, lm: LoadedLM, n: int, tokens: int) -> float:
    engine.clear_prefix_cache()
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    t0 = time.monotonic()
    streams = [engine.submit(render(lm, f"{PROMPTS[i % len(PROMPTS)]} Version {i}."), params) for i in range(n)]
    results = [await s.result() for s in streams]
    return sum(r.completion_tokens for r in results) / (max(r.finished_at for r in results) - t0)


async def agreement(engine: LLMEngine, lm_ref: LoadedLM, tokens: int) -> list[str]:
    out = []
    for q in PROMPTS:
        ids = render(lm_ref, q)
        x = torch.tensor([ids])
        with torch.inference_mode():
            ref = lm_ref.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, do_sample=False,
                                        repetition_penalty=1.0, pad_token_id=lm_ref.tokenizer.pad_token_id)
        ref = ref[0, len(ids):].tolist()
        r = await engine.submit(ids, SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=tokens)).result()
        n = 0
        while n < min(len(ref), len(r.token_ids)) and ref[n] == r.token_ids[n]:
            n += 1
        out.append(f"{n}/{len(ref)}")
    return out


async def main_async(args) -> dict:
    cache_dir = Path(args.cache_dir).expanduser()
    fp32 = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="float32")
    bf16 = load_lm(embedded_llm(), cache_dir=cache_dir, dtype="bfloat16")
    int8 = dataclasses.replace(fp32, weight_format="int8")
    max_threads = torch.get_num_threads()
    configs = {}
    for name, lm in (("float32", fp32), ("bfloat16", bf16), ("int8", int8)):
        for threads in sorted({1, max_threads}) + [0]:
            if threads == 0 and name != "float32":
                continue
            label = f"{name}/threads={'adaptive' if threads == 0 else threads}"
            configs[label] = (lm, LLMEngine(lm, EngineConfig(threads=threads)))
    for _, eng in configs.values():
        eng.start()
    try:
        rates: dict[str, list[float]] = {k: [] for k in configs}
        for _ in range(args.repeats):
            for label, (lm, eng) in configs.items():
                rates[label].append(await decode_rate(eng, render(lm, PROMPTS[0]), args.tokens))
        agg: dict[str, dict[str, float]] = {}
        for label in (f"float32/threads={max_threads}", f"int8/threads={max_threads}"):
            lm, eng = configs[label]
            one = [await aggregate_rate(eng, lm, 1, args.tokens) for _ in range(2)]
            eight = [await aggregate_rate(eng, lm, 8, args.tokens) for _ in range(2)]
            agg[label] = {"1_stream_tok_s": round(max(one), 2), "8_streams_tok_s": round(max(eight), 2),
                          "ratio": round(max(eight) / max(one), 2)}
        agree = {}
        for name in ("float32", "bfloat16", "int8"):
            lm, eng = configs[f"{name}/threads={max_threads}"]
            agree[name] = await agreement(eng, fp32, 24)
    finally:
        for _, eng in configs.values():
            eng.close()
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tokens": args.tokens,
        "single_stream_decode_tok_s_median": {k: round(statistics.median(v), 2) for k, v in rates.items()},
        "single_stream_decode_tok_s_all": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "aggregate": agg,
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
