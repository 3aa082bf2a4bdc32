"""What the remote LLM backend costs (issue 18), in one run on one machine: a worker gateway (the engine
in process) and a front gateway whose LLM is that worker (--llm-backend, token flavour).

    python -m benchmarks.remote_hop [--trials 20] [--cancels 10]

- TTFT: the same streamed chat completion (a short question, 8 tokens, greedy) sent to the worker itself
  and through the front, alternating which goes first; every request asks its own question (both paths
  share the worker's engine, so neither is helped by the other's cache beyond the chat template).
- Cancel -> the worker stops: a Realtime reply of up to 400 tokens is cancelled (response.cancel) after its
  first delta, on the front and, as the baseline, on the worker itself; the time from the cancel to the
  worker's engine counting the request cancelled (its /metrics, read every 2 ms).

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
import websockets

from benchmarks.int4_kernels import cpu_model
from benchmarks.safety import timed
from gateway.bench.clients import stream_chat
from gateway.platform.processes import GatewayProcess

MODEL = "smollm2-135m-instruct"
COUNTRIES = ("France", "Italy", "Spain", "Germany", "Japan", "Egypt", "Peru", "Canada", "Kenya", "Norway", "Chile",
             "India", "Greece", "Ireland", "Mexico", "Poland", "Brazil", "Sweden", "Turkey", "Vietnam")


async def ttft_ms(http: httpx.AsyncClient, url: str, question: str) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 8, "temperature": 0,
            "stream": True}
    started = time.perf_counter()
    return float(timed(await stream_chat(http, f"{url}/v1/chat/completions", body), started)["ttft_ms"])


async def cancelled_count(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    match = re.search(r"^gateway_engine_requests_cancelled (\S+)$", text, re.M)
    assert match
    return float(match.group(1))


async def cancel_to_stop_ms(http: httpx.AsyncClient, session_url: str, worker_url: str) -> float:
    async with websockets.connect(f"{session_url.replace('http', 'ws', 1)}/v1/realtime?model={MODEL}") as ws:

        async def until(kind: str) -> dict[str, Any]:
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == kind:
                    return event

        await until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"output_modalities": ["text"]}}))
        await until("session.updated")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count from 1 to 500."}]}}))
        before = await cancelled_count(http, worker_url)
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        await until("response.output_text.delta")
        started = time.perf_counter()
        await ws.send(json.dumps({"type": "response.cancel"}))
        while await cancelled_count(http, worker_url) == before:
            if time.perf_counter() - started > 5:
                raise RuntimeError("the worker's request did not stop within 5 s")
            await asyncio.sleep(0.002)
        return (time.perf_counter() - started) * 1000


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 1), "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
            "max": round(ordered[-1], 1), "count": len(ordered)}


async def measure(worker: GatewayProcess, front: GatewayProcess, trials: int, cancels: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as http:
        for url in (worker.url, front.url):  # warm both paths (connections, template, first steps)
            await ttft_ms(http, url, "Hello!")
        local: list[float] = []
        remote: list[float] = []
        for trial in range(trials):
            first, second = (worker.url, front.url) if trial % 2 == 0 else (front.url, worker.url)
            times = {url: await ttft_ms(http, url, f"What is the capital of {COUNTRIES[(2 * trial + i) % 20]}? ({trial})")
                     for i, url in enumerate((first, second))}
            local.append(times[worker.url])
            remote.append(times[front.url])
        cancel_local = [await cancel_to_stop_ms(http, worker.url, worker.url) for _ in range(cancels)]
        cancel_remote = [await cancel_to_stop_ms(http, front.url, worker.url) for _ in range(cancels)]
    return {
        "ttft_ms": {"in_process": summary(local), "remote": summary(remote),
                    "remote_minus_in_process_p50": round(statistics.median(remote) - statistics.median(local), 1)},
        "cancel_to_worker_stop_ms": {"in_process": summary(cancel_local), "remote": summary(cancel_remote)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--cancels", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="remote-hop-") as tmp:
        # Both without the safety policy: the hop alone is measured (a worker would otherwise hold text a second time).
        with GatewayProcess(Path(tmp) / "worker.log", args=["--no-load-voice-models", "--no-safety"]) as worker:
            worker.wait_ready(240)
            with GatewayProcess(Path(tmp) / "front.log", args=["--no-load-voice-models", "--no-safety", "--llm-backend",
                                                               f"{worker.url}/v1"]) as front:
                front.wait_ready(240)
                result = asyncio.run(measure(worker, front, args.trials, args.cancels))
    print(json.dumps({"cpu": cpu_model(), "trials": args.trials, "cancels": args.cancels, **result}, indent=2))


if __name__ == "__main__":
    main()
