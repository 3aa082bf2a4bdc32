"""The engine against llama.cpp on the same GGUF file, 2 threads each, measured in one run; prints JSON.

    pip install 'llama-cpp-python>=0.3.36,<0.4'   # compiles llama.cpp: about 10 min on 2 cores
    python -m benchmarks.llamacpp [--rounds 3] [--tokens 64] [--llama-python PATH]

llama.cpp (through llama-cpp-python, the peer ../shared/PEERS.md measured) runs in a child process,
never at the same time as the engine, and gets the same prompt token ids: its vocabulary is the
GGUF's, as the engine's tokenizer is. Rounds alternate the two (engine, llama.cpp, engine, ...) and
each figure is the median over rounds. Both decode greedily with EOS suppressed, so every run has the
same length, and the report shows both answers to the short question. Figures:

- TTFT of a short chat prompt, each side starting with an empty cache;
- single-stream decode tok/s over ``--tokens`` tokens;
- TTFT of a ~600-token system prompt the first time, and with another question after it (llama.cpp
  reuses the prompt prefix it has just evaluated; the engine its prefix cache);
- aggregate tok/s of 8 streams: the engine batches them; llama-cpp-python evaluates one sequence at a
  time, so they run one after another.

``--llama-python`` runs the child with another interpreter, one whose environment has llama_cpp
(the gateway's own environment need not).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.engine import (
    LONG_QUESTIONS,
    leading_agreement,
    render,
    run_streams,
    running,
    system_prompt,
    warm_up,
)
from inference.llm.backend import SamplingParams
from inference.llm.engine import LLMEngine
from inference.llm.forward import LeanForward
from inference.llm.loader import LoadedLM, load_lm
from inference.llm.threads import run_in_own_thread
from inference.models import embedded_llm

SHORT_QUESTION = "What is the capital of France?"
CHILD = Path(__file__).with_name("llamacpp_child.py")  # imports only llama_cpp and numpy


def prompts(lm: LoadedLM) -> dict:
    """Every prompt of the run as token ids, from the engine's tokenizer and chat template."""
    system = {"role": "system", "content": system_prompt(300, 600, lm.tokenizer)}
    return {
        "short": render(lm, [{"role": "user", "content": SHORT_QUESTION}]),
        "system_first": render(lm, [system, {"role": "user", "content": "When do you open?"}]),
        "system_other": render(lm, [system, {"role": "user", "content": "Can I return paint?"}]),
        "streams": [render(lm, [{"role": "user", "content": q}]) for q in LONG_QUESTIONS],
        "eos": sorted(lm.eos_token_ids),
    }


# -- llama.cpp, in a child process ------------------------------------------------------------------------
def llama_child(python: str, spec: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        done = subprocess.run([python, str(CHILD), f.name], capture_output=True, text=True, timeout=900)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if done.returncode != 0:
        raise SystemExit(f"the llama.cpp child failed (is llama-cpp-python installed for {python}?):\n"
                         f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


# -- the engine, in this process ---------------------------------------------------------------------------
async def engine_round(lm: LoadedLM, p: dict, tokens: int) -> dict:
    greedy = SamplingParams(temperature=0, repetition_penalty=1.0, ignore_eos=True)
    async with running(LLMEngine(lm)) as engine:
        await warm_up(engine, lm)

        async def run(ids: list[int], n: int, clear: bool):
            if clear:
                engine.clear_prefix_cache()
            return await engine.submit(ids, dataclasses.replace(greedy, max_tokens=n)).result()

        short = await run(p["short"], 1, True)
        long = await run(p["short"], tokens, True)
        first = await run(p["system_first"], 1, True)
        other = await run(p["system_other"], 1, False)
        engine.clear_prefix_cache()
        streams = await run_streams(engine, lm, len(p["streams"]), tokens)
    return {
        "short_ttft_s": short.first_token_at - short.submitted_at,
        "decode_tok_s": (long.completion_tokens - 1) / (long.finished_at - long.first_token_at),
        "system_first_ttft_s": first.first_token_at - first.submitted_at,
        "system_other_question_ttft_s": other.first_token_at - other.submitted_at,
        "eight_streams_tok_s": streams["aggregate_tok_s"],
        "short_tokens": long.token_ids,
    }


async def main_async(args) -> dict:
    gguf = embedded_llm()
    lm = await run_in_own_thread(lambda: load_lm(gguf, cache_dir=Path(args.cache_dir).expanduser(), device="cpu",
                                                 kernels=args.llm_kernels))
    p = prompts(lm)
    spec = {"gguf": str(gguf), "threads": args.threads, "tokens": args.tokens, "prompts": p}
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(await engine_round(lm, p, args.tokens))
        theirs.append(await asyncio.to_thread(llama_child, args.llama_python, spec))

    def median(rounds: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    report: dict = {"model": gguf.name, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
                    "engine_weight_format": lm.weight_format,
                    "engine_llm": LeanForward.for_model(lm.model, lm.context_window, lm.weight_format,
                                                        kernel_dir=lm.cache_dir, kernels=lm.kernels,
                                                        gguf=lm.gguf if lm.weight_format == "gguf" else None
                                                        ).describe(),
                    "llama_cpp_system_info": theirs[0]["system_info"],
                    "prompt_tokens": {"short": len(p["short"]), "system": len(p["system_first"])}}
    for key, faster_is in (("short_ttft_s", "lower"), ("decode_tok_s", "higher"), ("system_first_ttft_s", "lower"),
                           ("system_other_question_ttft_s", "lower"), ("eight_streams_tok_s", "higher")):
        a, b = median(ours, key), median(theirs, key)
        report[key] = {"engine": round(a, 4), "llama_cpp": round(b, 4),
                       "engine_advantage": round(b / a if faster_is == "lower" else a / b, 2)}
    # The answers themselves: llama.cpp multiplies Q4_1 weights with 8-bit activations (Q8_1), the
    # engine with 15-bit ones (inference/llm/q4_matmul.c says what 8 bits did to this model).
    report["greedy_tokens_equal_from_the_start"] = leading_agreement(ours[0]["short_tokens"], theirs[0]["short_tokens"])
    report["answer_to_short_question"] = {
        "question": SHORT_QUESTION,
        "engine": lm.tokenizer.decode(ours[0]["short_tokens"], skip_special_tokens=True),
        "llama_cpp": lm.tokenizer.decode(theirs[0]["short_tokens"], skip_special_tokens=True),
    }
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (the engine uses torch's)")
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway")
    ap.add_argument("--llm-kernels", default="auto", help="the engine's --llm-kernels (auto, vnni, avx2, torch)")
    ap.add_argument("--llama-python", default=sys.executable, help="the interpreter that has llama_cpp")
    args = ap.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
