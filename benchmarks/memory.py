"""What memory (gateway/generation/memory.py) costs, in one run on one gateway: two API keys, one with memory on (holding
`--memories` facts, so each question recalls some) and one with it off, asked the same streamed chat completions
in alternation (which goes first alternates too).

    python -m benchmarks.memory [--trials 20] [--max-tokens 64] [--memories 50]

- TTFT and tokens/s as a client sees them, memory on and off. With memory on, the prompt also holds the recalled
  facts and the `remember` tool's description, and the question waits for the database (is memory on, which facts).
- A save through the tool: `tool_choice` names `remember`, so the first round writes the call (under the grammar)
  and a second round answers. Its time to the first text the client sees, against a plain answer's (both with
  memory on). `prompt_tokens` of a save counts both rounds' prompts.

Prints one JSON object with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.int4_kernels import cpu_model
from benchmarks.safety import MODEL, TOPICS, summary, timed
from gateway.bench.clients import stream_chat
from gateway.platform.processes import GatewayProcess

KEYS = ("sk-bench-memory-on", "sk-bench-memory-off")


async def one(http: httpx.AsyncClient, question: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    started = time.perf_counter()
    return timed(await stream_chat(http, "/v1/chat/completions", body), started)


async def measure(url: str, trials: int, max_tokens: int, memories: int) -> dict[str, Any]:
    clients = {name: httpx.AsyncClient(base_url=url, timeout=120, headers={"authorization": f"Bearer {key}"})
               for name, key in zip(("on", "off"), KEYS, strict=True)}
    try:
        on = clients["on"]
        (await on.post("/v1/memories/settings", json={"enabled": True})).raise_for_status()
        for n in range(memories):  # facts about the topics, so that questions recall some
            fact = f"Remember that my note {n} says {TOPICS[n % len(TOPICS)]} matter to me."
            (await on.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": fact}]})).raise_for_status()
        for client in clients.values():  # warm both (connections, template, first steps)
            await one(client, "Hello!", 8)
        runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": [], "plain": [], "saved": []}
        for trial in range(trials):
            question = f"Write a few sentences about {TOPICS[trial % len(TOPICS)]}. ({trial})"
            order = ("on", "off") if trial % 2 == 0 else ("off", "on")
            for name in order:
                runs[name].append(await one(clients[name], question, max_tokens))
            told = f"My favourite topic is {TOPICS[trial % len(TOPICS)]} ({trial})."
            pair = (("plain", {}), ("saved", {"tool_choice": {"type": "function", "function": {"name": "remember"}}}))
            for name, extra in pair if trial % 2 == 0 else pair[::-1]:
                runs[name].append(await one(on, told, max_tokens, **extra))
        listed = (await on.get("/v1/memories")).json()["data"]
        (await on.delete("/v1/memories")).raise_for_status()
    finally:
        for client in clients.values():
            await client.aclose()
    report: dict[str, Any] = {name: {"ttft_ms": summary([r["ttft_ms"] for r in found]),
                                     "prompt_tokens_p50": summary([r["prompt_tokens"] for r in found])["p50"]}
                              for name, found in runs.items()}
    for name in ("on", "off"):  # (a save's tokens/s would mix its two rounds' tokens with the second's time)
        report[name]["tokens_per_s"] = summary([r["tokens_per_s"] for r in runs[name] if r["tokens_per_s"]])
    report["cost"] = {
        "ttft_ms_p50": round(report["on"]["ttft_ms"]["p50"] - report["off"]["ttft_ms"]["p50"], 2),
        "tokens_per_s_p50": round(report["on"]["tokens_per_s"]["p50"] - report["off"]["tokens_per_s"]["p50"], 2),
        "save_through_the_tool_ttft_ms_p50": round(report["saved"]["ttft_ms"]["p50"] - report["plain"]["ttft_ms"]["p50"], 2),
    }
    report["memories_held"] = len(listed)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--memories", type=int, default=50, help="facts the key with memory on holds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        with GatewayProcess(Path(tmp) / "gateway.log", args=["--no-load-voice-models", "--api-keys", ",".join(KEYS)]) \
                as gateway:
            gateway.wait_ready(240)
            report = asyncio.run(measure(gateway.url, args.trials, args.max_tokens, args.memories))
    print(json.dumps({"cpu": cpu_model(), "trials": args.trials, "max_tokens": args.max_tokens,
                      "memories": args.memories, **report}, indent=2))


if __name__ == "__main__":
    main()
