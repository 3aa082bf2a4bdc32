"""The gateway against llama.cpp's own server on the same GGUF file, server against server, in one run; prints JSON.

    python -m benchmarks.llama_server --llama-server PATH [--llama-perplexity PATH] [--model FILE.gguf]
                                      [--rounds 2] [--tokens 64] [--threads 2]

Rounds alternate the two servers, one at a time on the machine (each started, measured and stopped in turn): the
gateway (`gateway serve --llm-model FILE`, text only, its defaults) and `llama-server -m FILE -np 8 -t THREADS
-c 8192` (continuous batching over 8 slots). Both are asked the same token ids through `/v1/completions`
(streamed, greedy with no repetition penalty, EOS ignored); completion tokens are counted by re-tokenizing each text with the model's own
tokenizer, the same for both. Each figure is the median over rounds, with the ratio (the gateway ahead when > 1):

- `short_ttft_s`: a short chat prompt, new to the server (a nonce in it), to its first token;
- `one_stream_tok_s`: one stream's decoding, the first token's time excluded;
- `cold_prompt_s` / `warm_prompt_s`: a ~600-token system prompt new to the server, then the same one with another
  question after it (a prefix either server may have cached), to the first token;
- `eight_streams_tok_s`: eight streams at once, all their tokens over the wall time.

`agreement`: greedy answers to fixed chat prompts (`--agree-tokens` tokens each, from the last round): how many
leading tokens the two servers' answers share. `perplexity` (with `--llama-perplexity`): llama.cpp's
`llama-perplexity -c 512` over a fixed text (this repository's LICENSE), and the engine's over the same text the
same way: 512-token chunks, each scored on its second half.

Building llama-server: shared/PEERS.md (llama-cpp-python's source package vendors llama.cpp; `cmake --build build
--target llama-server llama-perplexity`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.openai_servers import serving
from benchmarks.turn_taking import _cpu
from gateway.platform.processes import GatewayProcess, free_port

LICENSE = Path(__file__).resolve().parents[1] / "LICENSE"
AGREEMENT_PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "Explain what a hash table is.",
                     "List three primary colors.", "Write a Python function that reverses a string.",
                     "Who wrote Hamlet?", "What does a compiler do?", "Give me a tip for a job interview.")
STREAM_QUESTIONS = ("Tell me about the history of Rome.", "How do airplanes fly?", "Describe a day at the beach.",
                    "What makes a good friend?", "Explain photosynthesis simply.", "Why is the sky blue?",
                    "How do I bake bread?", "What is machine learning?")


class Prompts:
    """Every prompt of the run, as token ids from the model's own tokenizer and chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        system = " ".join(["You are the assistant of a hardware store that sells paint, tools, wood and garden "
                           "supplies, open every day but Sunday, with a return policy of thirty days."] * 18)
        self.system = system

    def chat(self, user: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


async def _stream(client: httpx.AsyncClient, url: str, ids: list[int], tokens: int) -> tuple[float, float, str]:
    """(seconds to the first text, seconds to the end, the text) of one streamed greedy completion."""
    body = {"model": client.headers["x-model"], "prompt": ids, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, **json.loads(client.headers["x-extra"])}
    started = time.perf_counter()
    first, text = None, []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = "".join(c.get("text") or "" for c in chunk.get("choices", []))
            if piece:
                first = first if first is not None else time.perf_counter() - started
                text.append(piece)
    return first if first is not None else math.nan, time.perf_counter() - started, "".join(text)


async def measure(url: str, model: str, p: Prompts, tokens: int, agree_tokens: int,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One server's figures (it is up at ``url`` and serves ``model``; ``extra``: more fields of every request)."""
    # A connection per request, for both: llama-server drops a kept-alive one after a streamed answer.
    async with httpx.AsyncClient(timeout=600, headers={"x-model": model, "x-extra": json.dumps(extra or {})},
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        await _stream(client, url, p.chat("Hello."), 4)  # warm-up
        nonce = secrets.token_hex(4)
        short, _, _ = await _stream(client, url, p.chat(f"[{nonce}] What is the capital of France?"), 1)
        first, total, text = await _stream(client, url, p.chat("Tell me a long story about a dragon."), tokens)
        one = (p.count(text) - 1) / (total - first)
        cold, _, _ = await _stream(client, url, p.chat("When do you open?", f"[{nonce}] {p.system}"), 1)
        warm, _, _ = await _stream(client, url, p.chat("Can I return paint?", f"[{nonce}] {p.system}"), 1)
        started = time.perf_counter()
        answers = await asyncio.gather(*(_stream(client, url, p.chat(q), tokens) for q in STREAM_QUESTIONS))
        eight = sum(p.count(a[2]) for a in answers) / (time.perf_counter() - started)
        agreed = [(await _stream(client, url, p.chat(q), agree_tokens))[2] for q in AGREEMENT_PROMPTS]
    return {"short_ttft_s": short, "one_stream_tok_s": one, "cold_prompt_s": cold, "warm_prompt_s": warm,
            "eight_streams_tok_s": eight, "answers": agreed}


def shared_tokens(p: Prompts, a: str, b: str) -> int:
    x, y = p.tokenizer(a, add_special_tokens=False)["input_ids"], p.tokenizer(b, add_special_tokens=False)["input_ids"]
    return next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))


def engine_perplexity(model: Path, text: str, context: int = 512) -> float:
    """The engine's perplexity over ``text`` as llama-perplexity scores it: ``context``-token chunks (a BOS first
    where the model wants one), each scored on its second half."""
    import torch

    from gateway.platform.config import default_cache_dir
    from inference.llm.forward import LeanForward
    from inference.llm.kv_manager import KVPool
    from inference.llm.loader import load_lm
    from inference.llm.step_plan import Segment

    lm = load_lm(model, cache_dir=default_cache_dir())
    fwd = LeanForward.for_model(lm.model, lm.context_window, lm.weight_format, kernel_dir=lm.cache_dir,
                                kernels=lm.kernels, gguf=lm.gguf)
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = lm.tokenizer.bos_token_id if getattr(lm.tokenizer, "add_bos_token", False) else None
    step = context - (bos is not None)
    nll, counted = 0.0, 0
    for start in range(0, len(ids) - step + 1, step):
        chunk = ([bos] if bos is not None else []) + ids[start:start + step]
        pool = KVPool(fwd.kv_layout, 1, max_capacity=context, capacity=context)
        pool.acquire()
        n = len(chunk)
        logits = fwd.forward(pool, torch.tensor(chunk), torch.arange(n), [Segment(0, 0, n)], list(range(n)))
        logp = torch.log_softmax(logits.double(), dim=-1)
        for i in range(context // 2, n - 1):
            nll -= float(logp[i, chunk[i + 1]])
            counted += 1
    return math.exp(nll / counted)


def llama_perplexity(binary: Path, model: Path, text: str, threads: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    out = subprocess.run([str(binary), "-m", str(model), "-f", f.name, "-c", "512", "-t", str(threads)],
                         capture_output=True, text=True, check=True)
    os.unlink(f.name)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if found is None:
        raise RuntimeError("llama-perplexity printed no final estimate")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--llama-perplexity", type=Path)
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the embedded model)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--agree-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from gateway.platform.config import default_cache_dir, own_model_name
    from inference.llm.loader import gguf_config_folder, load_lm
    from inference.models import embedded_llm

    model = args.model or embedded_llm()
    load_lm(model, cache_dir=default_cache_dir())  # the gateway's own cache, so its start is a warm one
    p = Prompts(AutoTokenizer.from_pretrained(str(gguf_config_folder(model, default_cache_dir()))))
    logs = Path(tempfile.mkdtemp(prefix="llama-server-bench-"))
    rounds: dict[str, list[dict[str, Any]]] = {"gateway": [], "llama_server": []}
    described: dict[str, Any] = {}
    for r in range(args.rounds):
        # Greedy with no repetition penalty on both sides (the gateway's default is 1.1, llama-server's 1.0).
        gateway = GatewayProcess(logs / f"gateway-{r}.log", args=[
            "--llm-model", str(model), "--no-load-voice-models", "--admission-latency-ms", "0",
            "--repetition-penalty", "1.0"]).start()
        try:
            described = gateway.wait_ready(timeout_s=600)["llm"]
            rounds["gateway"].append(asyncio.run(measure(gateway.url, own_model_name(model), p, args.tokens,
                                                         args.agree_tokens)))
        finally:
            gateway.stop()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with serving([str(args.llama_server), "-m", str(model), "-np", "8", "-t", str(args.threads), "-c", "8192",
                      "--port", str(port)], f"{url}/health", logs / f"llama-{r}.log"):
            rounds["llama_server"].append(asyncio.run(measure(url, model.name, p, args.tokens, args.agree_tokens,
                                                              {"repeat_penalty": 1.0})))
    figures: dict[str, Any] = {}
    for key, higher in (("short_ttft_s", False), ("one_stream_tok_s", True), ("cold_prompt_s", False),
                        ("warm_prompt_s", False), ("eight_streams_tok_s", True)):
        ours = statistics.median(r[key] for r in rounds["gateway"])
        theirs = statistics.median(r[key] for r in rounds["llama_server"])
        figures[key] = {"gateway": round(ours, 4), "llama_server": round(theirs, 4),
                        "ratio": round(ours / theirs if higher else theirs / ours, 2),
                        "per_round": {k: [round(x[key], 4) for x in v] for k, v in rounds.items()}}
    ours_answers, their_answers = rounds["gateway"][-1]["answers"], rounds["llama_server"][-1]["answers"]
    report: dict[str, Any] = {
        "cpu": _cpu(), "model": str(model), "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
        "gateway_llm": described, "figures": figures,
        "agreement": {"tokens": args.agree_tokens,
                      "shared_leading_tokens": [shared_tokens(p, a, b) for a, b in zip(ours_answers, their_answers)],
                      "gateway_first": ours_answers[0], "llama_server_first": their_answers[0]},
        "logs": str(logs)}
    if args.llama_perplexity is not None:
        text = LICENSE.read_text()
        ours_ppl = engine_perplexity(model, text)
        theirs_ppl = llama_perplexity(args.llama_perplexity, model, text, args.threads)
        report["perplexity"] = {"text": "LICENSE (GPL-3.0)", "context": 512, "gateway": round(ours_ppl, 4),
                                "llama_cpp": round(theirs_ppl, 4),
                                "difference_pct": round(100 * (ours_ppl - theirs_ppl) / theirs_ppl, 2)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
