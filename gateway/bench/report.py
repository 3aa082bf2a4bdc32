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

from gateway.bench.stages import MEASURED, STAGES, ClockOffset
from gateway.bench.stats import METRICS, TurnRecord, metric_values, stage_values, summarize

TABLE_COLUMNS = ("count", "p50", "p90", "p95", "p99", "max", "mean")
OVER_TIME = ("ttft_ms", "voice_to_voice_ms")  # the metrics of latency_over_time.png
COMPARED = (*METRICS, "tokens_per_s", "audio_rtf", "audio_stall_ms")  # the summaries --compare puts side by side


def build_report(turns: list[TurnRecord], *, config: dict[str, Any], version: str, duration_s: float,
                 overhead: dict[str, Any], interrupted: bool, clock: ClockOffset | None,
                 core_seconds_per_turn: dict[str, float] | None = None,
                 barge_in_stop: dict[str, float] | None = None,
                 links: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ok = [turn for turn in turns if turn.error is None]
    rates = [rate for turn in ok if (rate := turn.tokens_per_s) is not None]
    stages = {stage: summarize(values) for stage in STAGES if (values := stage_values(turns, stage))}
    return {
        "tool": "gateway bench", "version": version, "config": config, "interrupted": interrupted,
        "duration_s": round(duration_s, 2),
        "sessions": len({turn.session for turn in turns}),
        "turns": len(turns), "turns_ok": len(ok),
        "errors": dict(Counter(turn.error for turn in turns if turn.error is not None)),
        **{metric: summarize(metric_values(turns, metric)) for metric in METRICS},
        "tokens_per_s": summarize(rates),
        "audio_rtf": summarize([rtf for turn in ok if (rtf := turn.audio_rtf) is not None]),
        "audio_stall_ms": summarize([stall for turn in ok if (stall := turn.audio_stall_ms) is not None]),
        "barge_in_missed": sum(turn.barge_in_missed for turn in ok),
        # The server's latency marks per stage (stages.py), and the clock offset behind the cross-clock ones.
        "server_stages_ms": stages,
        "clock_offset": clock.public() if clock is not None else None,
        # The server's core-seconds per turn by kind of work, and its process's CPU seconds (ladder.py); None
        # where the server has no such /metrics.
        "server_core_seconds_per_turn": core_seconds_per_turn,
        # The server's barge-ins in the run: their count and mean stop time, speech detected to the reply stopped.
        "server_barge_in_stop": barge_in_stop,
        # Each spoken session's downlink as its transport saw it (WebRTC: RTP jitter and loss; Twilio: the media
        # messages' interarrival); None for the modes whose transport tells nothing.
        "downlink": links or None,
        "overhead": overhead,
    }


def print_table(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"gateway bench: {report['config']['mode']} on {report['config']['url']}")
    table.add_column("metric")
    for column in TABLE_COLUMNS:
        table.add_column(column, justify="right")
    for name, summary in _rows(report):
        table.add_row(name, *(_cell(summary[column]) for column in TABLE_COLUMNS))
    console.print(table)
    errors = ", ".join(f"{code}: {n}" for code, n in report["errors"].items()) or "none"
    lag = report["overhead"]["loop_lag_ms"]
    console.print(f"sessions {report['sessions']}, turns {report['turns_ok']}/{report['turns']} ok, errors: {errors}; "
                  f"the tool's own event-loop lag p99 {lag['p99']} ms, CPU {report['overhead']['cpu_percent']}%")
    for line in _notes(report):
        console.print(line)


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The table's rows: the client's metrics, then the server's stages."""
    rows = [(metric, report[metric]) for metric in COMPARED if report.get(metric, {}).get("count")]
    return rows + [(f"stage {stage}", summary) for stage, summary in report["server_stages_ms"].items()]


def _notes(report: dict[str, Any]) -> list[str]:
    notes = []
    if report["config"]["mode"] in MEASURED:
        clock = report["clock_offset"]
        notes.append(f"clock offset (server - client) {clock['offset_ms']} ms \u00b1 {clock['uncertainty_ms']} ms, "
                     f"from {clock['probes']} /healthz probes" if clock else
                     "no clock offset (/healthz gives no time_ms): no uplink or downlink stage")
    if report["config"].get("barge_in"):
        notes.append(f"barge-in: {report['barge_in_ms']['count']} timed, {report['barge_in_missed']} missed "
                     "(the answer was over, or not stopped, before the interruption)")
    return notes


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def write_outputs(out: Path, report: dict[str, Any], turns: list[TurnRecord], concurrency: list[tuple[float, int]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = [turn.row() for turn in turns]
    stage_columns = [f"stage_{stage}_ms" for stage in STAGES if any(stage in turn.stages for turn in turns)]
    columns = [name for name in rows[0] if not name.startswith("stage_")] + stage_columns if rows else ["session", "turn"]
    with (out / "turns.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    plots = _plots(out, report, turns, concurrency)
    (out / "report.html").write_text(_html(report, plots))


def _plots(out: Path, report: dict[str, Any], turns: list[TurnRecord],
           concurrency: list[tuple[float, int]]) -> list[Path]:
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
    series = over_time(turns)
    for metric, (starts, values) in series.items():
        ax.scatter(starts, values, s=8, label=metric)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("ms")
    if series:
        ax.legend(loc="upper left")
    if concurrency:
        twin = ax.twinx()
        twin.step([t for t, _ in concurrency], [n for _, n in concurrency], where="post", color="gray", label="sessions")
        twin.set_ylabel("sessions active")
    ax.set_title("Latency over time, with the concurrency")
    paths.append(_save(fig, out / "latency_over_time.png"))
    if report["server_stages_ms"]:
        paths.append(_stages_plot(plt, report, out / "stages.png"))
    plt.close("all")
    return paths


def over_time(turns: list[TurnRecord]) -> dict[str, tuple[list[float], list[float]]]:
    """latency_over_time.png's points per metric (when each turn started, its value): TTFT, and voice-to-voice
    for spoken turns; a metric no turn has is left out."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for metric in OVER_TIME:
        timed = [(turn.started_at, value) for turn in turns
                 if turn.error is None and (value := getattr(turn, metric)) is not None]
        if timed:
            series[metric] = ([start for start, _ in timed], [value for _, value in timed])
    return series


def _stages_plot(plt: Any, report: dict[str, Any], path: Path) -> Path:
    """Each quantile's stages stacked, with the client's own measurement of the same span beside them.
    (A sum of per-stage quantiles is not the quantile of the sum: the two bars differ by that too.)"""
    stages = report["server_stages_ms"]
    measured = MEASURED[report["config"]["mode"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.get_cmap("tab10")
    for position, q in enumerate(("p50", "p90")):
        bottom = 0.0
        for index, (stage, summary) in enumerate(stages.items()):
            height = max(0.0, summary[q])  # a cross-clock stage within the offset's uncertainty of 0 may be < 0
            ax.bar(position * 3, height, bottom=bottom, color=colors(index), label=stage if position == 0 else None)
            bottom += height
        client = report[measured][q]
        if client is not None:
            ax.bar(position * 3 + 1, client, color="gray", label=f"client {measured}" if position == 0 else None)
    ax.set_xticks([0, 1, 3, 4], ["stages p50", "client p50", "stages p90", "client p90"])
    ax.set_ylabel("ms")
    clock = report["clock_offset"]
    ax.set_title("Server stages" + (f" (clock offset {clock['offset_ms']} \u00b1 {clock['uncertainty_ms']} ms)"
                                    if clock else " (no clock offset: no uplink or downlink)"))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _html(report: dict[str, Any], plots: list[Path]) -> str:
    rows = "".join(
        f"<tr><th>{name}</th>" + "".join(f"<td>{_cell(summary[c])}</td>" for c in TABLE_COLUMNS) + "</tr>"
        for name, summary in _rows(report)
    )
    notes = "".join(f"<p>{html.escape(line)}</p>" for line in _notes(report))
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
        f"<table><tr><th>metric</th>{''.join(f'<th>{c}</th>' for c in TABLE_COLUMNS)}</tr>{rows}</table>{notes}"
        f"{images}<h2>Configuration</h2><pre>{config}</pre>"
    )


def compare(paths: list[Path], console: Console, out: Path | None) -> None:
    """Runs side by side: p50 and p95 of each metric, with each run's ratio to the first."""
    reports = [load_report(path) for path in paths]
    names = [f"{i + 1}: {r['config']['url']} ({r['config']['mode']})" for i, r in enumerate(reports)]
    table = Table(title="gateway bench --compare (ratio: this run / the first)")
    table.add_column("metric")
    for name in names:
        table.add_column(name, justify="right")
    stages = [stage for stage in STAGES if any(stage in r.get("server_stages_ms", {}) for r in reports)]
    summaries = {metric: [r.get(metric, {}) for r in reports] for metric in COMPARED}
    summaries.update({f"stage {stage}": [r.get("server_stages_ms", {}).get(stage, {}) for r in reports]
                      for stage in stages})
    for metric, per_run in summaries.items():
        for q in (50, 95):
            values = [summary.get(f"p{q}") for summary in per_run]
            if all(v is None for v in values):
                continue
            base = values[0]
            cells = [_cell(v) + (f" ({v / base:.2f}x)" if i and v is not None and base else "")
                     for i, v in enumerate(values)]
            table.add_row(f"{metric} p{q}", *cells)
    console.print(table)
    if out is not None:
        _compare_plot(reports, names, out)


def load_report(path: Path) -> dict[str, Any]:
    """A report.json of this tool, with what --compare reads in the shape it expects (ValueError: one line)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(report, dict) or report.get("tool") != "gateway bench":
        raise ValueError(f"{path} is not a report.json of gateway bench")
    config = report.get("config")
    if not isinstance(config, dict) or not all(isinstance(config.get(key), str) for key in ("url", "mode")):
        raise ValueError(f"{path} is not a report.json of gateway bench")
    stages = report.get("server_stages_ms", {})
    summaries = [report.get(metric, {}) for metric in COMPARED]
    summaries += list(stages.values()) if isinstance(stages, dict) else [None]
    for summary in summaries:
        if not isinstance(summary, dict) or not all(isinstance(summary.get(q), int | float | None)
                                                    for q in ("p50", "p95", "count")):
            raise ValueError(f"{path} is not a report.json of gateway bench (a summary is malformed)")
    return report


def _compare_plot(reports: list[dict[str, Any]], names: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in METRICS if any(r.get(m, {}).get("count") for r in reports)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(reports))
    for i, (report, name) in enumerate(zip(reports, names)):
        ax.bar([j + i * width for j in range(len(metrics))], [report.get(m, {}).get("p50") or 0 for m in metrics], width,
               label=f"{name} p50")
    ax.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(metrics))], metrics)
    ax.set_ylabel("ms (p50)")
    ax.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    _save(fig, out / "compare.png")
    plt.close("all")

