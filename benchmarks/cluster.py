"""`gateway bench` against a cluster and against one gateway, in one run on this machine (issue 18):

    python -m benchmarks.cluster [--sessions 40] [--turns 3] [--out bench-cluster]

1. `gateway cluster`'s topology, text only: 2 replicas (prompts rendered there) in front of 2 LLM workers
   (gateways serving /v1/completions), Redis, PostgreSQL (or SQLite) and the two HAProxy routers;
2. one gateway with its LLM in process, text only.

The same `gateway bench --mode text` run (sessions at once, turns, 64 tokens, think time 0-2 s, seeded)
goes to each, and `gateway bench --compare` prints them side by side. On one 2-core machine the cluster's
six processes share the cores that one gateway has to itself: the comparison shows what the hops and the
routers cost, not what more machines would add. Prints one JSON object with both reports' headline
figures and the CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.int4_kernels import cpu_model
from gateway.platform.cluster import Cluster
from gateway.platform.processes import GatewayProcess


def bench(url: str, out: Path, sessions: int, turns: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "gateway", "bench", "--url", url, "--mode", "text", "--sessions", str(sessions),
               "--turns", str(turns), "--think-time", "2", "--ramp", "20", "--max-tokens", "64", "--seed", "1",
               "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "report.json").read_text())


def headline(report: dict[str, Any]) -> dict[str, Any]:
    pick = ("p50", "p95", "max", "count")
    return {"turns": report["turns"], "errors": report["errors"],
            "ttft_ms": {k: report["ttft_ms"][k] for k in pick}, "itl_ms": {k: report["itl_ms"][k] for k in pick}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-cluster"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        with Cluster(Path(tmp) / "cluster", replicas=2, workers=2, voice=False) as cluster:
            assert cluster.router is not None
            clustered = bench(cluster.router.url, args.out / "cluster", args.sessions, args.turns)
        with GatewayProcess(Path(tmp) / "single" / "gateway.log", args=["--no-load-voice-models"]) as single:
            single.wait_ready(300)
            alone = bench(single.url, args.out / "single", args.sessions, args.turns)
    compared = subprocess.run([sys.executable, "-m", "gateway", "bench", "--compare", str(args.out / "cluster" / "report.json"),
                               str(args.out / "single" / "report.json"), "--out", str(args.out / "compare")],
                              check=True, capture_output=True, text=True)
    print(compared.stdout, file=sys.stderr)
    print(json.dumps({"cpu": cpu_model(), "sessions": args.sessions, "turns_each": args.turns,
                      "cluster_2_replicas_2_workers": headline(clustered), "one_gateway": headline(alone)}, indent=2))


if __name__ == "__main__":
    main()
