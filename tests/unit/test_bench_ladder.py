"""The capacity ladder's pure parts: the --sessions ladder, the server's core-seconds, a level's row, the files."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gateway.bench.ladder import (
    PROCESS,
    barge_in_stop,
    build_ladder,
    level_row,
    parse_sessions,
    per_turn,
    print_ladder,
    server_counters_in,
    write_ladder,
)

METRICS_TEXT = """# HELP gateway_core_seconds_total Core-seconds held by model work
# TYPE gateway_core_seconds_total counter
gateway_core_seconds_total{work="asr_final"} 1.5
gateway_core_seconds_total{work="tts"} 4.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.0
# HELP gateway_errors_total Errors sent to clients
# TYPE gateway_errors_total counter
gateway_errors_total{surface="realtime",code="x"} 3.0
"""


def test_sessions_is_one_count_or_a_rising_ladder() -> None:
    assert parse_sessions("4") == [4]
    assert parse_sessions("1,2,4,8") == [1, 2, 4, 8]
    assert parse_sessions(" 1, 3 ") == [1, 3]
    for bad in ("", "0", "2,1", "1,1", "a,b", "-1"):
        with pytest.raises(ValueError):
            parse_sessions(bad)


def test_core_seconds_are_read_from_prometheus_text_and_divided_by_the_turns() -> None:
    before = server_counters_in(METRICS_TEXT)
    assert before == {"asr_final": 1.5, "tts": 4.0, PROCESS: 12.0}
    after = server_counters_in(METRICS_TEXT.replace(" 1.5", " 2.5").replace(" 4.0", " 4.0").replace(" 12.0", " 16.0")
                            + 'gateway_core_seconds_total{work="llm"} 2.0\n')
    # tts did not move: left out; llm is new since the first reading: all of it counts.
    assert per_turn(before, after, 4) == {"asr_final": 0.25, "llm": 0.5, PROCESS: 1.0}
    assert per_turn(None, after, 4) is None and per_turn(before, after, 0) is None
    assert server_counters_in("# nothing here\n") == {}


def test_the_servers_barge_ins_are_counted_apart_from_the_work() -> None:
    histogram = ("# HELP gateway_barge_in_seconds From the interruption to the reply stopped\n"
                 "# TYPE gateway_barge_in_seconds histogram\n"
                 'gateway_barge_in_seconds_bucket{le="+Inf"} %d\ngateway_barge_in_seconds_count %d\n'
                 "gateway_barge_in_seconds_sum %s\n")
    before = server_counters_in(METRICS_TEXT + histogram % (2, 2, "0.05"))
    after = server_counters_in(METRICS_TEXT.replace(" 12.0", " 16.0") + histogram % (6, 6, "0.062"))
    assert barge_in_stop(before, after) == {"count": 4, "mean_ms": 3.0}
    assert per_turn(before, after, 4) == {PROCESS: 1.0}  # no barge-in counter passes for work
    assert barge_in_stop(before, before) is None and barge_in_stop(None, after) is None
    assert barge_in_stop(server_counters_in(METRICS_TEXT), server_counters_in(METRICS_TEXT)) is None


def _report(sessions: int, ok: int, turns: int, p50: float | None, mode: str = "voice") -> dict[str, Any]:
    metric = {"count": ok, "p50": p50, "p95": None if p50 is None else p50 * 2, "max": p50}
    empty = {"count": 0, "p50": None, "p95": None, "max": None}
    barge_in = {"count": 2, "p50": 210.0, "p95": 250.0, "max": 260.0} if mode == "voice" else empty
    return {"config": {"mode": mode, "url": "http://127.0.0.1:1", "sessions": sessions, "turns": 3},
            "barge_in_ms": barge_in, "barge_in_missed": 1,
            "turns": turns, "turns_ok": ok, "errors": {"timeout": turns - ok} if turns > ok else {},
            "voice_to_voice_ms": metric if mode == "voice" else empty, "ttft_ms": metric if mode != "voice" else empty,
            "server_stages_ms": {"asr": {"p50": 10.0, "p95": 20.0, "count": ok}}, "duration_s": 9.0,
            "server_core_seconds_per_turn": {"tts": 0.5}, "server_barge_in_stop": {"count": 2, "mean_ms": 2.5}}


def test_a_level_counts_turns_never_started_as_lost_and_reads_its_modes_metric() -> None:
    row = level_row(_report(sessions=2, ok=4, turns=5, p50=300.0))
    assert (row["sessions"], row["turns_ok"], row["turns_lost"], row["metric"]) == (2, 4, 2, "voice_to_voice_ms")
    assert (row["p50_ms"], row["p95_ms"]) == (300.0, 600.0)
    assert row["stages_ms"] == {"asr": {"p50": 10.0, "p95": 20.0}}
    assert row["core_seconds_per_turn"] == {"tts": 0.5}
    assert row["barge_in_ms"] == {"p50": 210.0, "p95": 250.0, "missed": 1, "server_stop_mean": 2.5}
    text = level_row(_report(sessions=1, ok=3, turns=3, p50=80.0, mode="text"))
    assert text["metric"] == "ttft_ms" and text["barge_in_ms"] is None


def test_the_ladder_writes_its_json_and_plot(tmp_path: Path) -> None:
    ladder = build_ladder([_report(1, 3, 3, 300.0), _report(2, 6, 6, 400.0), _report(4, 0, 12, None)], "a CPU")
    path = write_ladder(tmp_path, ladder)
    assert path.read_bytes().startswith(b"\x89PNG")
    written = json.loads((tmp_path / "ladder.json").read_text())
    assert [level["sessions"] for level in written["levels"]] == [1, 2, 4]
    assert written["cpu"] == "a CPU" and written["levels"][2]["turns_lost"] == 12


def test_the_ladders_table_has_a_column_per_level_and_a_row_per_stage_and_work() -> None:
    out = io.StringIO()
    print_ladder(build_ladder([_report(1, 3, 3, 300.0), _report(2, 6, 6, 400.0)], "a CPU"), Console(file=out, width=200))
    table = out.getvalue()
    assert "1 sessions" in table and "2 sessions" in table and "a CPU" in table
    assert "300 / 600" in table and "stage asr p50 / p95" in table and "core-s / turn tts" in table
    assert "210 / 250 (1)" in table and "server's stop ms, mean" in table and "2.5" in table
