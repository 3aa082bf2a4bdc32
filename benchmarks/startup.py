"""Cold and warm start of the gateway, and one stream's time to first token and tokens/s over HTTP.

    python -m benchmarks.startup [--runs 5]

Cold start uses a fresh cache folder, so it includes the GGUF -> safetensors conversion; warm
start reuses that folder. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gateway.platform.processes import GatewayProcess

QUESTION = "Tell me about the history of Paris."


def timed_start(cache_dir: Path, log_dir: Path, name: str) -> tuple[GatewayProcess, float, dict]:
    started = time.monotonic()
    gateway = GatewayProcess(log_dir / f"{name}.log", args=["--cache-dir", str(cache_dir)]).start()
    health = gateway.wait_ready(timeout_s=600)
    return gateway, time.monotonic() - started, health["load_seconds"]


def stream_once(url: str, max_tokens: int) -> dict[str, float]:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    first = None
    usage = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                first = time.monotonic()
            usage = chunk.get("usage") or usage
    end = time.monotonic()
    assert first is not None
    tokens = usage["completion_tokens"]
    return {"ttft_s": first - sent, "tokens": tokens, "decode_tok_s": (tokens - 1) / (end - first)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache, logs = Path(tmp) / "cache", Path(tmp)
        print("cold start (converting the GGUF)...", file=sys.stderr)
        cold, cold_s, cold_load = timed_start(cache, logs, "cold")
        cold.stop()
        print("warm start...", file=sys.stderr)
        warm, warm_s, warm_load = timed_start(cache, logs, "warm")
        try:
            stream_once(warm.url, 8)  # first request pays one-off allocations
            runs = [stream_once(warm.url, args.max_tokens) for _ in range(args.runs)]
        finally:
            warm.stop()
    result = {
        "cold_start_s": round(cold_s, 2),
        "cold_llm_load_s": round(cold_load["llm_s"], 2),
        "cold_converted": cold_load["llm_converted"],
        "warm_start_s": round(warm_s, 2),
        "warm_llm_load_s": round(warm_load["llm_s"], 2),
        "cold_over_warm": round(cold_s / warm_s, 2),
        "ttft_s_median": round(statistics.median(r["ttft_s"] for r in runs), 3),
        "decode_tok_s_median": round(statistics.median(r["decode_tok_s"] for r in runs), 1),
        "runs": runs,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
