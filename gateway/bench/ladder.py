"""A capacity ladder: the same workload at several session counts (`--sessions 1,2,4,8`), one row per level.

Each level is a run of its own (its report in `sessions-N/`); the ladder puts their latency (voice-to-voice,
or TTFT in the text modes), each server stage's p50/p95, the turns lost and the core-seconds each kind of
work took per turn side by side, in ladder.json, a table and ladder.png (latency against sessions).

The core-seconds come from the server's /metrics, read before and after a level: this gateway's
`gateway_core_seconds_total{work}` (each model call's wall time times its cores) and the process's own
`process_cpu_seconds_total`. So does the server's part of a barge-in (`gateway_barge_in_seconds`: speech
detected to the reply stopped and trimmed), beside the client's onset-to-stop figure, whose detection varies
with the VAD's 32 ms windows. A server without them gets no such column; nothing else depends on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from gateway.bench.stages import MEASURED, STAGES

PROCESS = "process"  # the process's own CPU seconds, beside the model work's core-seconds
# gateway_barge_in_seconds' sum and count, kept beside the core-seconds of a reading (not work: see barge_in_stop)
BARGE_IN_SUM, BARGE_IN_COUNT = "gateway_barge_in_seconds_sum", "gateway_barge_in_seconds_count"


def parse_sessions(value: str | int | list[int]) -> list[int]:
    """`--sessions`: one count, or a ladder of them ("1,2,4,8"), each at least 1, strictly increasing."""
    if isinstance(value, int):
        levels = [value]
    elif isinstance(value, list):
        levels = value
    else:
        try:
            levels = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--sessions takes a count or counts separated by commas (1,2,4,8), not {value!r}") from None
    if not levels:
        raise ValueError("--sessions needs at least one count")
    if any(level < 1 for level in levels):
        raise ValueError(f"--sessions counts are at least 1, not {levels}")
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"--sessions counts of a ladder go up, each once: {levels}")
    return levels


def server_counters_in(text: str) -> dict[str, float]:
    """The core-seconds by work and the process's CPU seconds, from Prometheus text ({} when it has neither), and
    the barge-ins' stop time (BARGE_IN_SUM, BARGE_IN_COUNT) where it has them."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_core_seconds_total" and "work" in sample.labels:
                found[sample.labels["work"]] = float(sample.value)
            elif sample.name == "process_cpu_seconds_total":
                found[PROCESS] = float(sample.value)
            elif sample.name in (BARGE_IN_SUM, BARGE_IN_COUNT):
                found[sample.name] = float(sample.value)
    return found


async def read_server_counters(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> dict[str, float] | None:
    """The server's counters now, or None where it serves no /metrics (another server: no CPU columns)."""
    try:
        response = await http.get(f"{url}/metrics", headers=headers, timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return server_counters_in(response.text) or None
    except ValueError:  # not Prometheus text
        return None


def per_turn(before: dict[str, float] | None, after: dict[str, float] | None, turns: int) -> dict[str, float] | None:
    """What each kind of work took per turn between two readings (work that did not run is left out)."""
    if before is None or after is None or turns <= 0:
        return None
    used = {work: after[work] - before.get(work, 0.0) for work in after if work not in (BARGE_IN_SUM, BARGE_IN_COUNT)}
    return {work: round(seconds / turns, 3) for work, seconds in sorted(used.items()) if seconds > 0}


def barge_in_stop(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """The server's barge-ins between two readings: how many, and their mean from speech detected to the reply
    stopped (ms); None where there were none, or the server does not say."""
    if before is None or after is None or BARGE_IN_COUNT not in after:
        return None
    count = after[BARGE_IN_COUNT] - before.get(BARGE_IN_COUNT, 0.0)
    if count <= 0:
        return None
    seconds = after[BARGE_IN_SUM] - before.get(BARGE_IN_SUM, 0.0)
    return {"count": int(count), "mean_ms": round(1000 * seconds / count, 1)}


def _planned(report: dict[str, Any]) -> int | None:
    turns = report["config"].get("turns")
    return report["config"]["sessions"] * turns if isinstance(turns, int) else None


def level_row(report: dict[str, Any]) -> dict[str, Any]:
    """One level of the ladder from its run's report."""
    measured = MEASURED.get(report["config"]["mode"], "ttft_ms")
    planned = _planned(report)
    stop = report.get("server_barge_in_stop")
    summary = report[measured]
    return {
        "sessions": report["config"]["sessions"],
        "turns_ok": report["turns_ok"],
        # Turns planned but not answered: failed, or never started (an interrupted or --duration run).
        "turns_lost": (planned - report["turns_ok"]) if planned is not None else report["turns"] - report["turns_ok"],
        "errors": report["errors"],
        "metric": measured,
        "p50_ms": summary["p50"], "p95_ms": summary["p95"], "max_ms": summary["max"],
        "stages_ms": {stage: {"p50": s["p50"], "p95": s["p95"]}
                      for stage, s in report["server_stages_ms"].items()},
        "core_seconds_per_turn": report.get("server_core_seconds_per_turn"),
        # --barge-in: from the onset of the interrupting speech to the answer stopped (VAD's 160 ms included).
        "barge_in_ms": ({"p50": report["barge_in_ms"]["p50"], "p95": report["barge_in_ms"]["p95"],
                         "missed": report.get("barge_in_missed", 0),
                         "server_stop_mean": (stop or {}).get("mean_ms")}
                        if report.get("barge_in_ms", {}).get("count") else None),
        # Voice over the WebSocket: the silence a listener would hear within an answer (voice.py).
        "audio_stall_ms": ({"p95": stall["p95"], "max": stall["max"]}
                           if (stall := report.get("audio_stall_ms", {})).get("count") else None),
        "duration_s": report["duration_s"],
    }


def build_ladder(reports: list[dict[str, Any]], cpu: str | None) -> dict[str, Any]:
    first = reports[0]["config"]
    return {"tool": "gateway bench ladder", "mode": first["mode"], "url": first["url"], "cpu": cpu,
            "levels": [level_row(report) for report in reports]}


def host_cpu() -> str | None:
    """This machine's CPU model and vector extensions (every figure says which CPU it came from); None off Linux.
    It is the server's CPU where the server runs here, as the bench usually does."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = "avx512_vnni" if "avx512_vnni" in flags else "avx2" if "avx2" in flags else "no avx2"
    cores = sum(1 for line in info.splitlines() if line.startswith("processor"))
    return f"{model} ({isa}, {cores} CPUs)"


def print_ladder(ladder: dict[str, Any], console: Console) -> None:
    levels = ladder["levels"]
    metric = levels[0]["metric"] if levels else "ttft_ms"
    stages = [stage for stage in STAGES if any(stage in level["stages_ms"] for level in levels)]
    works = sorted({work for level in levels for work in (level["core_seconds_per_turn"] or {})},
                   key=lambda work: (work == PROCESS, work))
    table = Table(title=f"gateway bench ladder: {ladder['mode']} on {ladder['url']} ({ladder['cpu'] or 'CPU unknown'})")
    table.add_column("")
    for level in levels:
        table.add_column(f"{level['sessions']} sessions", justify="right")
    table.add_row(f"{metric} p50 / p95", *(f"{_ms(level['p50_ms'])} / {_ms(level['p95_ms'])}" for level in levels))
    table.add_row("turns ok / lost", *(f"{level['turns_ok']} / {level['turns_lost']}" for level in levels))
    if any(level["barge_in_ms"] for level in levels):
        table.add_row("barge_in_ms p50 / p95 (missed)", *(
            f"{_ms(b['p50'])} / {_ms(b['p95'])} ({b['missed']})" if (b := level["barge_in_ms"]) else "-"
            for level in levels))
        table.add_row("server's stop ms, mean", *(
            f"{b['server_stop_mean']:.1f}" if (b := level["barge_in_ms"]) and b.get("server_stop_mean") is not None
            else "-" for level in levels))
    if any(level["audio_stall_ms"] for level in levels):
        table.add_row("audio stall ms p95 / max", *(
            f"{_ms(s['p95'])} / {_ms(s['max'])}" if (s := level["audio_stall_ms"]) else "-" for level in levels))
    for stage in stages:
        table.add_row(f"stage {stage} p50 / p95", *(
            f"{_ms(s['p50'])} / {_ms(s['p95'])}" if (s := level["stages_ms"].get(stage)) else "-" for level in levels))
    for work in works:
        label = "process CPU s / turn" if work == PROCESS else f"core-s / turn {work}"
        table.add_row(label, *(f"{value:.3f}" if (value := (level["core_seconds_per_turn"] or {}).get(work)) is not None
                               else "-" for level in levels))
    console.print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def write_ladder(out: Path, ladder: dict[str, Any]) -> Path:
    """ladder.json and ladder.png in `out`; the plot's path."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "ladder.json").write_text(json.dumps(ladder, indent=2) + "\n")
    levels = [level for level in ladder["levels"] if level["p50_ms"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    sessions = [level["sessions"] for level in levels]
    metric = levels[0]["metric"] if levels else "latency"
    ax.plot(sessions, [level["p50_ms"] for level in levels], marker="o", label=f"{metric} p50")
    ax.plot(sessions, [level["p95_ms"] for level in levels], marker="o", label=f"{metric} p95")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sessions, [str(n) for n in sessions])
    ax.set_xlabel("sessions at once")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{ladder['mode']}: latency against sessions ({ladder['cpu'] or 'CPU unknown'})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "ladder.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
