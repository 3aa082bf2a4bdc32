"""The LLM engine on a GPU, against transformers' own continuous batching, in one run; prints JSON.

    python -m benchmarks.gpu [--device cuda] [--weights random|embedded] [--layers 30] [--tokens 64]

``--weights random`` (the default) builds the embedded model's shape with seeded random weights and a
byte-level tokenizer (benchmarks/synthetic_lm.py), so that a GPU machine needs no weight file. Speed
does not depend on the weights' values. ``--weights embedded`` loads the embedded SmolLM2 instead.

1. TTFT of a ~600-token system prompt seen for the first time vs the same system prompt with another
   question (the prefix cache);
2. aggregate tok/s of 8 concurrent streams vs 1 stream (medians of pairs);
3. aggregate tok/s of 8 greedy streams vs transformers' ContinuousBatchingManager (``generate_batch``)
   on an identical copy of the model (same seed), with how many streams gave the same greedy tokens.

Also ``paths``: what each part of a step runs on. ``--device cpu`` runs the same sections on the CPU
(the test suite does, with two layers, so the script stays working where no GPU is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.engine import (
    bench_concurrency,
    bench_system_prompt,
    bench_transformers_batching,
    running,
    warm_up,
)
from benchmarks.synthetic_lm import EMBEDDED_LAYERS, random_loaded_lm
from inference.llm.engine import LLMEngine
from inference.llm.loader import LoadedLM, load_lm
from inference.llm.threads import run_in_own_thread
from inference.models import embedded_llm


def load_pair(args, cache_dir: Path) -> tuple[LoadedLM, LoadedLM]:
    """The engine's copy and an untouched one for transformers (the engine re-lays its model's weights)."""
    if args.weights == "random":
        return tuple(random_loaded_lm(cache_dir, layers=args.layers, device=args.device) for _ in range(2))
    return tuple(load_lm(embedded_llm(), device=args.device, cache_dir=cache_dir, max_context_tokens=2048)
                 for _ in range(2))


async def main_async(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="gw-bench-gpu-") as tmp:
        cache_dir = Path(args.cache_dir).expanduser() if args.weights == "embedded" else Path(tmp)
        lm, stock = await run_in_own_thread(load_pair, args, cache_dir)
        report: dict = {"device": args.device, "weights": args.weights,
                        "layers": len(lm.model.model.layers), "dtype": str(lm.dtype).removeprefix("torch.")}
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name()
        async with running(LLMEngine(lm)) as engine:
            report["paths"] = engine.fwd.describe()
            await warm_up(engine, lm)
            report["1_system_prompt_ttft"] = await bench_system_prompt(engine, lm, args.repeats)
            await warm_up(engine, lm)
            report["2_concurrency"] = await bench_concurrency(engine, lm, args.tokens, args.pairs)
        report["3_transformers_continuous_batching"] = await bench_transformers_batching(lm, stock, args.tokens,
                                                                                         args.repeats)
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--weights", choices=("random", "embedded"), default="random")
    ap.add_argument("--layers", type=int, default=EMBEDDED_LAYERS, help="decoder layers of random weights")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=5, help="1-then-8-stream pairs for section 2")
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway", help="for --weights embedded")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("torch sees no CUDA device (use --device cpu to run the same sections on the CPU)")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
