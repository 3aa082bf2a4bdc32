"""A GGUF file under each weight format the engine runs it in: greedy tokens against float32 with the file's own
de-quantized numbers, and decoding speed, one stream and eight at once. Prints one JSON object.

    python -m benchmarks.gguf_formats [--model FILE.gguf] [--formats float32,int4,gguf] [--tokens 48] [--rounds 1]

`gguf` runs each linear weight in the format that holds the file's own type (inference/llm/gguf_weights.py), `int4`
re-quantizes every linear to 4 bits (the output head to 8 bits per channel), `float32` is the reference. Each format
answers six chat prompts one after another (greedy, EOS ignored, `--tokens` each), then eight at once; the formats
alternate `--rounds` times. `agreeing_tokens` is, per prompt, how many leading tokens equal float32's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.turn_taking import _cpu
from inference.llm.backend import SamplingParams
from inference.llm.engine import EngineConfig, LLMEngine
from inference.llm.loader import LoadedLM, load_lm

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "Explain what a hash table is.",
           "List three primary colors.", "Write a Python function that reverses a string.", "Who wrote Hamlet?")
FORMATS = {"float32": "native", "int4": "int4", "gguf": "gguf"}


def _ids(lm: LoadedLM, prompt: str) -> list[int]:
    return list(lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))


async def _drain(stream: Any) -> list[int]:
    async for _ in stream:
        pass
    return list((await stream.result()).token_ids)


async def measure(lm: LoadedLM, weight_format: str, tokens: int) -> dict[str, Any]:
    """One format's answers and speeds."""
    variant = dataclasses.replace(lm, weight_format=weight_format)
    engine = LLMEngine(variant, EngineConfig(max_batch_size=8))
    engine.start()
    params = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    try:
        started = time.perf_counter()
        answers = [await _drain(engine.submit(_ids(lm, p), params)) for p in PROMPTS]
        one = sum(map(len, answers)) / (time.perf_counter() - started)
        started = time.perf_counter()
        together = await asyncio.gather(*(_drain(engine.submit(_ids(lm, p), params)) for p in PROMPTS + PROMPTS[:2]))
        eight = sum(map(len, together)) / (time.perf_counter() - started)
        return {"answers": answers, "one_stream_tok_s": one, "eight_streams_tok_s": eight,
                "paths": engine.fwd.describe()}
    finally:
        engine.close()


def agreeing(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.platform.config import default_cache_dir
    from inference.models import embedded_llm

    path = args.model or embedded_llm()
    # The file's own types read from its blocks (no float weights), and its float32 conversion for the others.
    lm = await asyncio.to_thread(load_lm, path, cache_dir=default_cache_dir(), threads=args.threads)
    floats = await asyncio.to_thread(load_lm, path, cache_dir=default_cache_dir(), threads=args.threads,
                                     dtype="float32")
    names = args.formats.split(",")
    unknown = [n for n in names if n not in FORMATS]
    if unknown or "float32" not in names:
        raise SystemExit(f"--formats takes {', '.join(FORMATS)}, float32 among them (not {', '.join(unknown)})")
    if "gguf" in names and lm.gguf is None:
        raise SystemExit(f"{path.name} does not run as gguf here (not a quantized GGUF, or the engine's kernels "
                         "do not run on this CPU)")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            runs[name].append(await measure(lm if name == "gguf" else floats, FORMATS[name], args.tokens))
    reference = runs["float32"][0]["answers"]
    report: dict[str, Any] = {"cpu": _cpu(), "model": str(path), "gguf_name": lm.gguf.index.name if lm.gguf else None,
                              "types": dict(lm.gguf.index.types()) if lm.gguf else None, "tokens": args.tokens,
                              "prompts": list(PROMPTS), "formats": {}}
    for name, measured in runs.items():
        report["formats"][name] = {
            "agreeing_tokens": [agreeing(a, r) for a, r in zip(measured[0]["answers"], reference)],
            "one_stream_tok_s": [round(m["one_stream_tok_s"], 1) for m in measured],
            "eight_streams_tok_s": [round(m["eight_streams_tok_s"], 1) for m in measured],
            "one_stream_median": round(statistics.median(m["one_stream_tok_s"] for m in measured), 1),
            "paths": measured[0]["paths"],
            "first_answer": lm.tokenizer.decode(measured[0]["answers"][0]),
        }
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the embedded model)")
    parser.add_argument("--formats", default="float32,int4,gguf")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=1, help="the formats alternate this many times")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args)), indent=1))


if __name__ == "__main__":
    main()
