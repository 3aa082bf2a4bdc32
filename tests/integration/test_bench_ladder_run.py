"""`gateway bench --sessions 1,2` as users run it (a subprocess), against the real gateway: a run per level and
the ladder's files, with the server's core-seconds per turn read from its /metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL


def test_a_ladder_runs_each_level_and_reports_the_servers_work_per_turn(gateway: GatewayProcess, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "--url", gateway.url, "--mode", "text", "--model", MODEL,
         "--sessions", "1,2", "--turns", "2", "--max-tokens", "8", "--seed", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ladder = json.loads((tmp_path / "ladder.json").read_text())
    assert (tmp_path / "ladder.png").read_bytes().startswith(b"\x89PNG")
    assert [level["sessions"] for level in ladder["levels"]] == [1, 2]
    for level in ladder["levels"]:
        report = json.loads((tmp_path / f"sessions-{level['sessions']}" / "report.json").read_text())
        assert report["config"]["sessions"] == level["sessions"] and report["turns_ok"] == level["turns_ok"]
        assert level["turns_ok"] + level["turns_lost"] == 2 * level["sessions"] and level["metric"] == "ttft_ms"
        assert level["p50_ms"] == report["ttft_ms"]["p50"] and "llm_first_token" in level["stages_ms"]
        work = level["core_seconds_per_turn"]
        # Text turns: the LLM's steps ran (the shared gateway may have other work of earlier tests' sessions to
        # finish, so only what these turns must have used is asserted); the process's CPU is counted too.
        assert work["llm"] > 0 and work["process"] > 0
    assert "ladder" in done.stdout and "1 sessions" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "gateway", "bench", "--url", gateway.url, "--sessions", "2,1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "go up" in bad.stderr
