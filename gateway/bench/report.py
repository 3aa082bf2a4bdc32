"""A run's report: the table printed at the end, report.json, turns.csv, PNG plots and report.html; and
`--compare`, runs side by side with ratios."""

from __future__ import annotations

import base64
import csv
import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway.bench.stats import METRICS, TurnRecord, metric_values, summarize

TABLE_COLUMNS = ("count", "p50", "p90", "p95", "p99", "max", "mean")


def build_report(turns: list[TurnRecord], *, config: dict[str, Any], version: str, duration_s: float,
                 overhead: dict[str, Any], interrupted: bool) -> dict[str, Any]:
    ok = [turn for turn in turns if turn.error is None]
    rates = [rate for turn in ok if (rate := turn.tokens_per_s) is not None]
    return {
        "tool": "gateway bench", "version": version, "config": config, "interrupted": interrupted,
        "duration_s": round(duration_s, 2),
        "sessions": len({turn.session for turn in turns}),
        "turns": len(turns), "turns_ok": len(ok),
        "errors": dict(Counter(turn.error for turn in turns if turn.error is not None)),
        **{metric: summarize(metric_values(turns, metric)) for metric in METRICS},
        "tokens_per_s": summarize(rates),
        "audio_rtf": summarize([rtf for turn in ok if (rtf := turn.audio_rtf) is not None]),
        "overhead": overhead,
    }


def print_table(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"gateway bench: {report['config']['mode']} on {report['config']['url']}")
    table.add_column("metric")
    for column in TABLE_COLUMNS:
        table.add_column(column, justify="right")
    for metric in (*METRICS, "tokens_per_s", "audio_rtf"):
        summary = report[metric]
        if summary["count"]:
            table.add_row(metric, *(_cell(summary[column]) for column in TABLE_COLUMNS))
    console.print(table)
    errors = ", ".join(f"{code}: {n}" for code, n in report["errors"].items()) or "none"
    lag = report["overhead"]["loop_lag_ms"]
    console.print(f"sessions {report['sessions']}, turns {report['turns_ok']}/{report['turns']} ok, errors: {errors}; "
                  f"the tool's own event-loop lag p99 {lag['p99']} ms, CPU {report['overhead']['cpu_percent']}%")


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def write_outputs(out: Path, report: dict[str, Any], turns: list[TurnRecord], concurrency: list[tuple[float, int]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = [turn.row() for turn in turns]
    with (out / "turns.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["session", "turn"])
        writer.writeheader()
        writer.writerows(rows)
    plots = _plots(out, turns, concurrency)
    (out / "report.html").write_text(_html(report, plots))


def _plots(out: Path, turns: list[TurnRecord], concurrency: list[tuple[float, int]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for metric in METRICS:
        values = sorted(metric_values(turns, metric))
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=metric)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of turns")
    ax.set_title("Latency CDFs")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ok = [turn for turn in turns if turn.error is None and turn.ttft_ms is not None]
    ax.scatter([turn.started_at for turn in ok], [turn.ttft_ms for turn in ok], s=8, label="TTFT (ms)")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("TTFT (ms)")
    if concurrency:
        twin = ax.twinx()
        twin.step([t for t, _ in concurrency], [n for _, n in concurrency], where="post", color="gray", label="sessions")
        twin.set_ylabel("sessions active")
    ax.set_title("Latency over time, with the concurrency")
    paths.append(_save(fig, out / "latency_over_time.png"))
    plt.close("all")
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _html(report: dict[str, Any], plots: list[Path]) -> str:
    rows = "".join(
        f"<tr><th>{metric}</th>" + "".join(f"<td>{_cell(report[metric][c])}</td>" for c in TABLE_COLUMNS) + "</tr>"
        for metric in (*METRICS, "tokens_per_s", "audio_rtf") if report[metric]["count"]
    )
    images = "".join(
        f'<img alt="{path.stem}" src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}">'
        for path in plots
    )
    config = html.escape(json.dumps(report["config"], indent=2))
    return (
        "<!doctype html><meta charset=utf-8><title>gateway bench report</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;text-align:right}img{max-width:48%}</style>"
        f"<h1>gateway bench: {html.escape(report['config']['mode'])}</h1>"
        f"<p>{report['turns_ok']}/{report['turns']} turns ok in {report['sessions']} sessions, "
        f"{report['duration_s']} s; errors: {html.escape(json.dumps(report['errors']))}</p>"
        f"<table><tr><th>metric</th>{''.join(f'<th>{c}</th>' for c in TABLE_COLUMNS)}</tr>{rows}</table>"
        f"{images}<h2>Configuration</h2><pre>{config}</pre>"
    )


def compare(paths: list[Path], console: Console, out: Path | None) -> None:
    """Runs side by side: p50 and p95 of each metric, with each run's ratio to the first."""
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
    names = [f"{i + 1}: {r['config']['url']} ({r['config']['mode']})" for i, r in enumerate(reports)]
    table = Table(title="gateway bench --compare (ratio: this run / the first)")
    table.add_column("metric")
    for name in names:
        table.add_column(name, justify="right")
    for metric in (*METRICS, "tokens_per_s", "audio_rtf"):
        for q in (50, 95):
            values = [r.get(metric, {}).get(f"p{q}") for r in reports]
            if all(v is None for v in values):
                continue
            base = values[0]
            cells = [_cell(v) + (f" ({v / base:.2f}x)" if i and v is not None and base else "")
                     for i, v in enumerate(values)]
            table.add_row(f"{metric} p{q}", *cells)
    console.print(table)
    if out is not None:
        _compare_plot(reports, names, out)


def _compare_plot(reports: list[dict[str, Any]], names: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in METRICS if any(r.get(m, {}).get("count") for r in reports)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(reports))
    for i, (report, name) in enumerate(zip(reports, names)):
        ax.bar([j + i * width for j in range(len(metrics))], [report[m]["p50"] or 0 for m in metrics], width,
               label=f"{name} p50")
    ax.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(metrics))], metrics)
    ax.set_ylabel("ms (p50)")
    ax.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    _save(fig, out / "compare.png")
    plt.close("all")

