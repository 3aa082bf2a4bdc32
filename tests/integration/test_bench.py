"""`gateway bench`, run as users run it (a subprocess), against the real gateway and against a server that
is not ours (`transformers serve`, OpenAI-compatible): its report, its agreement with an independent
measurement of the same requests, and its one-line errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.openai_servers import transformers_serve as start_transformers_serve
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL

METRIC_KEYS = {"count", "p50", "p90", "p95", "p99", "max", "mean"}


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def check_report(out: Path, *, mode: str, turns: int) -> dict:
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["mode"] == mode and report["turns"] == turns and report["turns_ok"] == turns, report
    assert report["errors"] == {} and not report["interrupted"]
    for metric in ("ttft_ms", "first_audio_ms", "voice_to_voice_ms", "barge_in_ms", "itl_ms"):
        assert set(report[metric]) == METRIC_KEYS
    ttft = report["ttft_ms"]
    assert ttft["count"] == turns and 0 < ttft["p50"] <= ttft["p95"] <= ttft["max"] < 30_000
    assert report["itl_ms"]["count"] > turns and report["tokens_per_s"]["p50"] > 1
    assert report["overhead"]["loop_lag_ms"]["count"] > 0 and report["version"]
    lines = (out / "turns.csv").read_text().splitlines()
    assert len(lines) == turns + 1 and lines[0].startswith("session,turn,started_at,ttft_ms")
    for name in ("latency_cdf.png", "latency_over_time.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in (out / "report.html").read_text()
    return report


def chat_ttft_totals(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = float(re.search(r"^gateway_chat_time_to_first_token_seconds_sum (\S+)", text, re.M).group(1))
    count = float(re.search(r"^gateway_chat_time_to_first_token_seconds_count (\S+)", text, re.M).group(1))
    return total, count


def test_text_and_chat_runs_write_their_report_and_compare(gateway: GatewayProcess, tmp_path: Path) -> None:
    text = bench("--url", gateway.url, "--mode", "text", "--model", MODEL, "--sessions", "2", "--turns", "2",
                 "--out", str(tmp_path / "text"))
    assert text.returncode == 0, text.stderr
    check_report(tmp_path / "text", mode="text", turns=4)
    assert "ttft_ms" in text.stdout

    before = chat_ttft_totals(gateway.url)
    chat = bench("--url", gateway.url, "--mode", "chat", "--model", MODEL, "--sessions", "2", "--turns", "2",
                 "--system-prompt-tokens", "200", "--out", str(tmp_path / "chat"))
    assert chat.returncode == 0, chat.stderr
    report = check_report(tmp_path / "chat", mode="chat", turns=4)
    # The independent measurement: the server's own TTFT of the same requests (the run's 4 turns and its
    # preflight request), from /metrics. The client's is that plus the HTTP round trip on loopback.
    after = chat_ttft_totals(gateway.url)
    server_mean_ms = 1000 * (after[0] - before[0]) / (after[1] - before[1])
    assert after[1] - before[1] == 5
    assert server_mean_ms - 5 <= report["ttft_ms"]["mean"] <= server_mean_ms + 100, (server_mean_ms, report["ttft_ms"])

    compared = bench("--compare", str(tmp_path / "text" / "report.json"), str(tmp_path / "chat" / "report.json"),
                     "--out", str(tmp_path / "compare"))
    assert compared.returncode == 0, compared.stderr
    assert "ttft_ms p50" in compared.stdout and "x)" in compared.stdout
    assert (tmp_path / "compare" / "compare.png").is_file()


@pytest.fixture(scope="module")
def transformers_serve(gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`transformers serve` on the embedded model's converted folder (the gateway fixture converted it)."""
    cache = Path(os.environ.get("GATEWAY_CACHE_DIR") or "~/.cache/realtime-gateway").expanduser()
    folder = gguf_cache_folder(embedded_llm(), cache)
    assert folder.is_dir()
    with start_transformers_serve(folder, tmp_path_factory.mktemp("peer") / "transformers-serve.log",
                                  timeout_s=120) as url:
        yield url, str(folder)


def test_chat_mode_against_a_server_that_is_not_ours(transformers_serve: tuple[str, str], tmp_path: Path) -> None:
    url, model = transformers_serve
    run = bench("--url", url, "--mode", "chat", "--model", model, "--sessions", "2", "--turns", "2",
                "--max-tokens", "16", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    check_report(tmp_path, mode="chat", turns=4)
    # Not a Realtime server: text mode says so in one line.
    refused = bench("--url", url, "--mode", "text", "--model", model, "--out", str(tmp_path / "no"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def test_bad_input_is_one_line_and_exit_2(secured_gateway: GatewayProcess, tmp_path: Path) -> None:
    cases = [
        (["--url", "http://127.0.0.1:9", "--mode", "chat"], "cannot reach"),
        (["--url", secured_gateway.url, "--mode", "chat", "--model", MODEL, "--api-key", "sk-wrong"], "refused the key"),
        (["--url", secured_gateway.url, "--mode", "text", "--model", MODEL, "--api-key", "sk-wrong"], "refused"),
        (["--url", secured_gateway.url, "--prompt-file", str(tmp_path / "missing.txt")], "cannot read --prompt-file"),
        (["--url", "ftp://example"], "must start with http"),
        (["--url", secured_gateway.url, "--sessions", "0"], "--sessions"),
        (["--compare", str(tmp_path / "missing.json")], "cannot read"),
    ]
    for args, message in cases:
        run = bench(*args, "--out", str(tmp_path / "out"), timeout=60)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert message in run.stderr and "Traceback" not in run.stderr, (args, run.stderr)


def test_ctrl_c_still_writes_the_report_of_what_finished(gateway: GatewayProcess, tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "gateway", "bench", "--url", gateway.url, "--mode", "text",
                                "--model", MODEL, "--sessions", "2", "--turns", "1000", "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # started, and some turns done
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["interrupted"] and 0 < report["turns_ok"] < 2000


def test_voice_mode_times_voice_to_voice_from_wav_files(gateway: GatewayProcess, tmp_path: Path, tts,
                                                          question_pcm) -> None:
    """Spoken turns at real-time pace with server VAD, from a folder of WAV files (44.1 kHz stereo here:
    the bench converts); the default, Piper speaking the built-in questions, is what the README runs."""
    import wave

    import numpy as np

    from media.resample import resample

    folder = tmp_path / "audio"
    folder.mkdir()
    stereo = np.repeat(resample(question_pcm, tts.sample_rate, 44100)[:, None], 2, axis=1)
    with wave.open(str(folder / "question.wav"), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(44100)
        wav.writeframes(stereo.astype("<i2").tobytes())
    run = bench("--url", gateway.url, "--mode", "voice", "--model", MODEL, "--sessions", "2", "--turns", "2",
                "--audio", str(folder), "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="voice", turns=4)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000 and report["first_audio_ms"]["count"] == 4
    assert report["audio_rtf"]["count"] == 4 and 0 < report["audio_rtf"]["p50"] < 1  # faster than real time

    (folder / "bad.wav").write_bytes(b"RIFF....WAVEfmt not really")
    bad = bench("--url", gateway.url, "--mode", "voice", "--audio", str(folder), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr
