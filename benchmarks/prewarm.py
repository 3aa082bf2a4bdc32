"""Pre-warm while typing: the time to the first token of a ~200-token message, with and without a
POST /backend-api/conversation/{id}/prepare of the same draft one second earlier, alternating in one run.

    python -m benchmarks.prewarm [--trials 10] [--url http://127.0.0.1:8000 --api-key KEY]

Without --url it starts a gateway (text only) on a free port. Each trial's message starts with its own
words, so no trial is helped by another's cache. Prints one JSON object: the client's TTFT (request to
first text delta) each way, their ratio, and whether every prepared reply said `prewarmed: true`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.int4_kernels import cpu_model
from gateway.platform.processes import GatewayProcess

MODEL = "smollm2-135m-instruct"
WORDS = ("amber", "basil", "cedar", "delta", "ember", "fable", "garnet", "harbor", "indigo", "juniper", "kestrel",
         "lantern", "meadow", "nectar", "orchid", "pebble", "quartz", "raven", "saffron", "thistle")
BODY = ("Here are my notes from the trip, please turn them into a short summary for my family: we left early on "
        "the first morning, drove along the coast for six hours, stopped twice for coffee and once for lunch in a "
        "small fishing village where the harbour was full of bright boats. The hotel was old but clean, the staff "
        "were kind, and the view from the balcony looked over the bay. On the second day we walked to the "
        "lighthouse, visited the market, bought cheese and bread, and watched the sunset from the cliffs. The "
        "third day it rained, so we stayed in the museum and the library, and in the evening we ate at a tiny "
        "restaurant that served only fish caught that day. We drove home on the fourth day, tired and happy.")


def draft(trial: int) -> str:
    return f"Trip {trial}: {WORDS[trial % len(WORDS)]} {WORDS[(trial * 7 + 3) % len(WORDS)]}. {BODY}"


def ask(http: httpx.Client, conversation: str, content: str) -> dict[str, Any]:
    sent = time.monotonic()
    first = None
    metadata: dict[str, Any] = {}
    body = {"model": MODEL, "content": content, "max_tokens": 8, "temperature": 0}
    with http.stream("POST", f"/backend-api/conversation/{conversation}/messages", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if first is None and ("v" in data and isinstance(data["v"], str)):
                first = time.monotonic()
            if data.get("o") == "patch":
                metadata = data["v"][1]["v"]
    assert first is not None, "no text came back"
    return {"ttft_ms": (first - sent) * 1000, **metadata}


def run(url: str, api_key: str | None, trials: int) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    cold: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        ask(http, http.post("/backend-api/conversations", json={}).json()["id"], draft(10_000))  # warm-up
        for trial in range(trials):
            for prepared in (False, True):
                conversation = http.post("/backend-api/conversations", json={}).json()["id"]
                content = draft(trial * 2 + prepared)
                if prepared:
                    http.post(f"/backend-api/conversation/{conversation}/prepare", json={"content": content}).raise_for_status()
                time.sleep(1.0)  # the user goes on typing
                (warm if prepared else cold).append(ask(http, conversation, content))

    def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
        ttfts = [r["ttft_ms"] for r in runs]
        return {"p50": round(statistics.median(ttfts), 1), "mean": round(statistics.fmean(ttfts), 1),
                "max": round(max(ttfts), 1)}

    without, with_prepare = summary(cold), summary(warm)
    return {
        "benchmark": "prewarm", "cpu": cpu_model(), "trials": trials,
        "prompt_tokens": round(statistics.fmean(r["usage"]["input_tokens"] for r in cold)),
        "ttft_ms_without_prepare": without, "ttft_ms_with_prepare": with_prepare,
        "ratio_p50": round(without["p50"] / with_prepare["p50"], 2),
        "cached_tokens_with_prepare_mean": round(statistics.fmean(r["usage"]["cached_tokens"] for r in warm), 1),
        "prewarmed_all": all(r["prewarmed"] for r in warm), "prewarmed_none_without": not any(r["prewarmed"] for r in cold),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--url", help="a running gateway (default: start one)")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    if args.url:
        print(json.dumps(run(args.url, args.api_key, args.trials), indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        gateway = GatewayProcess(Path(tmp) / "gateway.log", args=["--no-load-voice-models"]).start()
        try:
            gateway.wait_ready(timeout_s=300)
            print(json.dumps(run(gateway.url, None, args.trials), indent=2))
        finally:
            gateway.stop()


if __name__ == "__main__":
    main()
