"""Soak: many Realtime sessions with staggered turns, then many that open, fill and close; prints JSON.

    python -m benchmarks.soak [--sessions 200] [--seconds 60] [--churn 200] [--item-mib 1] [--url URL --pid PID]

It starts a gateway with its defaults, voice models loaded (or measures the one at ``--url``, whose process ``--pid`` is read from
/proc), warms it with one turn, then:
1. ``--sessions`` WebSocket sessions for ``--seconds``: each asks a short question (8 tokens), waits
   for the reply, pauses a random ``--think-s`` (2-10 s) and asks again (engine overload, 429
   ``server_overloaded``, counts as an error); turns that did not complete, errors, and the
   first text delta's latency (p50, p95);
2. ``--churn`` sessions, 20 at a time, that each add 3 items of ``--item-mib`` MiB of text and close.
The gateway's RSS, open file descriptors, threads and pinned conversations are read before (after the
warm-up), during phase 1, after phase 1 and after phase 2 (once it has settled for 3 s); the report
gives each against the start. All traffic stays on loopback; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from gateway.bench.clients import BenchError, RealtimeTextClient, Target
from gateway.bench.stats import TurnRecord
from gateway.platform.processes import GatewayProcess

MODEL = "smollm2-135m-instruct"
WARM_SESSIONS = 8
QUESTIONS = ["What is the capital of France?", "Name a colour.", "What is 2+2?", "Say hello."]


def process_figures(pid: int, url: str) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    open_fds = len(os.listdir(f"/proc/{pid}/fd"))  # before the /metrics request, whose socket would be one
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    pinned = re.search(r"^gateway_engine_conversations_pinned (\S+)", metrics, flags=re.M)
    return {"rss_mb": round(rss_kb / 1024, 1), "open_fds": open_fds, "threads": threads,
            "conversations_pinned": float(pinned.group(1)) if pinned else -1.0}


async def turn(client: RealtimeTextClient, question: str) -> float:
    """One text turn; the first delta's latency from the response.create, in seconds."""
    record = TurnRecord(session=0, turn=0, started_at=0.0)
    await client.turn(record, question)
    if record.error is not None or record.ttft_ms is None:
        raise RuntimeError(f"response failed: {record.error or 'no text'}")
    return record.ttft_ms / 1000


async def open_session(url: str) -> RealtimeTextClient:
    return await RealtimeTextClient.open(Target(url, MODEL, api_key=None, max_tokens=8, seed=None), None, timeout_s=60)


async def talker(url: str, deadline: float, think_s: tuple[float, float], rng: random.Random,
                 latencies: list[float], counts: dict) -> None:
    await asyncio.sleep(rng.uniform(0, think_s[1]))  # staggered starts
    try:
        client = await open_session(url)
    except Exception:
        counts["connect_errors"] += 1
        return
    try:
        while time.monotonic() < deadline:
            counts["turns"] += 1
            try:
                latencies.append(await turn(client, rng.choice(QUESTIONS)))
                counts["completed"] += 1
            except Exception as exc:
                counts["errors"] += 1
                counts.setdefault("error_kinds", {}).setdefault(str(exc)[:60], 0)
                counts["error_kinds"][str(exc)[:60]] += 1
                if isinstance(exc, BenchError):  # the server closed the session
                    return
            await asyncio.sleep(rng.uniform(*think_s))
    finally:
        await client.close()


async def churner(url: str, item_mib: float, counts: dict) -> None:
    text = "x" * int(item_mib * (1 << 20))
    client = await open_session(url)
    try:
        for _ in range(3):
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
            while (event := await client.next_event(60))["type"] not in ("conversation.item.done", "error"):
                pass
            counts["items" if event["type"] != "error" else "item_errors"] += 1
    finally:
        await client.close()


async def warm_session(url: str) -> None:
    client = await open_session(url)
    try:
        await turn(client, QUESTIONS[0])
    finally:
        await client.close()


async def soak(args, url: str, pid: int) -> dict:
    # Warm-up: the first turns' one-off allocations, and the worker threads that thread pools start only
    # when tasks overlap (the gateway's default executor has as many as cores).
    await asyncio.gather(*(warm_session(url) for _ in range(WARM_SESSIONS)))
    await asyncio.sleep(2)
    figures = {"start": await asyncio.to_thread(process_figures, pid, url)}
    rng = random.Random(1)
    latencies: list[float] = []
    counts = {"turns": 0, "completed": 0, "errors": 0, "connect_errors": 0}
    deadline = time.monotonic() + args.seconds
    talkers = [asyncio.create_task(talker(url, deadline, tuple(args.think_s), rng, latencies, counts))
               for _ in range(args.sessions)]
    await asyncio.sleep(args.seconds / 2)
    figures["during_sessions"] = await asyncio.to_thread(process_figures, pid, url)
    await asyncio.wait_for(asyncio.gather(*talkers), args.seconds + 180)
    await asyncio.sleep(3)
    figures["after_sessions"] = await asyncio.to_thread(process_figures, pid, url)
    churn = {"items": 0, "item_errors": 0}
    limit = asyncio.Semaphore(20)

    async def bounded() -> None:
        async with limit:
            await churner(url, args.item_mib, churn)

    await asyncio.wait_for(asyncio.gather(*(bounded() for _ in range(args.churn))), 900)
    await asyncio.sleep(3)
    figures["after_churn"] = await asyncio.to_thread(process_figures, pid, url)
    start = figures["start"]
    return {
        "sessions": args.sessions, "seconds": args.seconds, "think_s": args.think_s, **counts,
        "error_rate": round(counts["errors"] / max(1, counts["turns"]), 4),
        "first_delta_s": {"p50": round(statistics.median(latencies), 3),
                          "p95": round(statistics.quantiles(latencies, n=20)[-1], 3)} if len(latencies) > 1 else None,
        "churn_sessions": args.churn, "churn_items_added": churn["items"], "churn_item_errors": churn["item_errors"],
        "process": figures,
        "after_churn_vs_start": {k: round(figures["after_churn"][k] / start[k], 3) if start[k] else None
                                 for k in ("rss_mb", "open_fds", "threads")},
        "pinned_after_churn": figures["after_churn"]["conversations_pinned"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--think-s", type=float, nargs=2, default=(2.0, 10.0), metavar=("MIN", "MAX"),
                    help="a session's pause between its turns, drawn uniformly")
    ap.add_argument("--churn", type=int, default=200)
    ap.add_argument("--item-mib", type=float, default=1.0)
    ap.add_argument("--text-only", action="store_true", help="start the gateway without its voice models")
    ap.add_argument("--url", help="a running gateway (http://127.0.0.1:PORT) instead of starting one")
    ap.add_argument("--pid", type=int, help="with --url: its process id, for RSS, descriptors and threads")
    args = ap.parse_args(argv)
    if args.url:
        if args.pid is None:
            ap.error("--url needs --pid")
        report = asyncio.run(soak(args, args.url, args.pid))
    else:
        with tempfile.TemporaryDirectory(prefix="gw-soak-") as tmp:
            extra = ["--no-load-voice-models"] if args.text_only else []
            gateway = GatewayProcess(Path(tmp) / "gateway.log", args=extra).start()
            try:
                gateway.wait_ready(timeout_s=600)
                report = asyncio.run(soak(args, gateway.url, gateway.process.pid))
            finally:
                gateway.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
