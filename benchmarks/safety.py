"""What the safety layer (gateway/safety/) costs, in one run on one machine: two gateways, one with the policy on
(the default rules plus a denylist) and one with --no-safety, each with one LLM thread (so that on 2 cores
neither waits for the other's), asked the same streamed chat completions in alternation (which goes first
alternates too).

    python -m benchmarks.safety [--trials 20] [--max-tokens 64]

- TTFT: from sending the request to the first chunk with text, as a client sees it. With the policy on, that
  text waits for what may still become a match (usually the reply's first word waits for its second token).
- Tokens/s: completion tokens after the first, over the time from the first text chunk to the finish chunk.
- The filter alone: microseconds per delta of the streaming filter over the replies' own text, token by token
  (the same work the gateway does on the event loop for each delta).

Prints one JSON object with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.int4_kernels import cpu_model
from gateway.bench.clients import ChatStream, stream_chat
from gateway.platform.config import Settings
from gateway.platform.processes import GatewayProcess
from gateway.safety.rules import build_policy

MODEL = "smollm2-135m-instruct"
TOPICS = ("France", "the sea", "bread", "music", "the moon", "trains", "winter", "cats", "gardens", "rivers",
          "coffee", "bridges", "forests", "books", "rain", "mountains", "chess", "bees", "lighthouses", "tea")
DENYLIST = "# a small denylist, as a deployment would have\nsecret project\nre:launch\\s+codes?\ninternal only\n"


async def one(http: httpx.AsyncClient, url: str, question: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    stream = await stream_chat(http, f"{url}/v1/chat/completions", body)
    return timed(stream, started)


def timed(stream: ChatStream, started: float) -> dict[str, Any]:
    """TTFT from `started`, and tokens/s after the first text until the finish chunk (benchmarks.memory too)."""
    if stream.error is not None:
        raise RuntimeError(f"the chat completion failed: {stream.error}")
    first, finished = stream.first, stream.finished
    if first is None or finished is None:
        raise RuntimeError("no text in the stream")
    tokens = stream.usage.get("completion_tokens", 0)
    return {"ttft_ms": (first - started) * 1000, "tokens": tokens, "prompt_tokens": stream.usage.get("prompt_tokens", 0),
            "tokens_per_s": (tokens - 1) / (finished - first) if tokens > 1 and finished > first else None,
            "text": "".join(stream.text)}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 2), "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
            "mean": round(statistics.fmean(ordered), 2), "count": len(ordered)}


def filter_cost_us(texts: list[str], denylist: Path) -> float:
    """The streaming filter alone over the replies, fed word piece by word piece (about a token each)."""
    policy = build_policy(Settings(safety_denylist=denylist))
    pieces = [piece for text in texts for piece in re.findall(r"\s*\S{1,4}", text)]
    runs = []
    for _ in range(5):
        stream = policy.stream()
        started = time.perf_counter()
        for piece in pieces:
            stream.feed(piece)
        stream.flush()
        runs.append((time.perf_counter() - started) / max(1, len(pieces)) * 1e6)
    return round(min(runs), 2)


async def measure(on: GatewayProcess, off: GatewayProcess, trials: int, max_tokens: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    async with httpx.AsyncClient(timeout=120) as http:
        for url in (on.url, off.url):  # warm both (connections, template, first steps)
            await one(http, url, "Hello!", 8)
        for trial in range(trials):
            question = f"Write a few sentences about {TOPICS[trial % len(TOPICS)]}. ({trial})"
            order = (("on", on.url), ("off", off.url)) if trial % 2 == 0 else (("off", off.url), ("on", on.url))
            for name, url in order:
                results[name].append(await one(http, url, question, max_tokens))
    report: dict[str, Any] = {}
    for name, runs in results.items():
        report[name] = {"ttft_ms": summary([r["ttft_ms"] for r in runs]),
                        "tokens_per_s": summary([r["tokens_per_s"] for r in runs if r["tokens_per_s"]]),
                        "completion_tokens": sum(r["tokens"] for r in runs)}
    report["cost"] = {
        "ttft_ms_p50": round(report["on"]["ttft_ms"]["p50"] - report["off"]["ttft_ms"]["p50"], 2),
        "tokens_per_s_p50": round(report["on"]["tokens_per_s"]["p50"] - report["off"]["tokens_per_s"]["p50"], 2),
    }
    report["texts"] = [r["text"] for r in results["off"]]
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="safety-bench-") as tmp:
        denylist = Path(tmp) / "denylist.txt"
        denylist.write_text(DENYLIST, encoding="utf-8")
        common = ["--no-load-voice-models", "--llm-threads", "1"]
        with GatewayProcess(Path(tmp) / "on.log", args=[*common, "--safety-denylist", str(denylist)]) as on, \
                GatewayProcess(Path(tmp) / "off.log", args=[*common, "--no-safety"]) as off:
            on.wait_ready(240)
            off.wait_ready(240)
            report = asyncio.run(measure(on, off, args.trials, args.max_tokens))
        texts = report.pop("texts")
        report["filter_us_per_delta"] = filter_cost_us(texts, denylist)
    print(json.dumps({"cpu": cpu_model(), "trials": args.trials, "max_tokens": args.max_tokens, **report}, indent=2))


if __name__ == "__main__":
    main()
