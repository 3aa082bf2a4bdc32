"""The bench's report without a run (gateway/bench/report.py): the points of latency_over_time.png, and which
report.json files --compare takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.bench.report import load_report, over_time
from gateway.bench.stats import TurnRecord


def spoken_turn(turn: int, ttft_ms: float, voice_to_voice_ms: float | None, error: str | None = None) -> TurnRecord:
    return TurnRecord(session=0, turn=turn, started_at=float(turn), ttft_ms=ttft_ms,
                      voice_to_voice_ms=voice_to_voice_ms, error=error)


def test_latency_over_time_plots_voice_to_voice_for_spoken_turns() -> None:
    turns = [spoken_turn(0, 100, 400), spoken_turn(1, 200, None), spoken_turn(2, 300, 500, error="timeout")]
    assert over_time(turns) == {"ttft_ms": ([0.0, 1.0], [100, 200]), "voice_to_voice_ms": ([0.0], [400])}
    assert over_time([TurnRecord(session=0, turn=0, started_at=0.5, ttft_ms=80.0)]) == {"ttft_ms": ([0.5], [80.0])}


def write(path: Path, content: object) -> Path:
    path.write_text(json.dumps(content))
    return path


def test_compare_takes_only_reports_of_this_tool(tmp_path: Path) -> None:
    summary = {"count": 1, "p50": 1.0, "p95": 2.0}
    report = {"tool": "gateway bench", "config": {"url": "http://x", "mode": "text"}, "ttft_ms": summary,
              "server_stages_ms": {"uplink": summary}}
    assert load_report(write(tmp_path / "ok.json", report)) == report
    malformed = [[1, 2], {"a": 1}, {**report, "tool": "other"}, {**report, "config": {"url": "http://x"}},
                 {**report, "ttft_ms": [1]}, {**report, "ttft_ms": {"p50": "fast"}},
                 {**report, "server_stages_ms": {"uplink": None}}, {**report, "server_stages_ms": []}]
    for index, content in enumerate(malformed):
        with pytest.raises(ValueError, match="is not a report.json of gateway bench"):
            load_report(write(tmp_path / f"{index}.json", content))
