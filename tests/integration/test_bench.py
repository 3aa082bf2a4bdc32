"""`gateway bench`, run as users run it (a subprocess), against the real gateway and against a server that
is not ours (`transformers serve`, OpenAI-compatible): its report, its agreement with an independent
measurement of the same requests, the server's stages beside the client's view, and its one-line errors."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from benchmarks.openai_servers import transformers_serve as start_transformers_serve
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL

METRIC_KEYS = {"count", "p50", "p90", "p95", "p99", "max", "mean"}
PNG = b"\x89PNG\r\n\x1a\n"
VOICE_STAGES = ("uplink_vad", "asr", "response_start", "llm_first_token", "llm_first_clause", "tts_first_audio",
                "downlink")


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
        assert (out / name).read_bytes()[:8] == PNG
    assert "data:image/png;base64," in (out / "report.html").read_text()
    return report


def check_stages(out: Path, report: dict, stages: tuple[str, ...], measured: str) -> dict[str, dict[str, float]]:
    """Every turn's stages from the gateway's marks, clock-corrected, add up to the client's own measurement of
    the same span; none is below zero by more than the clock's uncertainty. Returns the stages' summaries."""
    clock = report["clock_offset"]
    assert abs(clock["offset_ms"]) < 50 and 0 <= clock["uncertainty_ms"] < 50 and clock["probes"] > 1  # one host
    summaries = report["server_stages_ms"]
    assert list(summaries) == list(stages) and all(s["count"] == report["turns"] for s in summaries.values())
    with (out / "turns.csv").open() as f:
        for row in csv.DictReader(f):
            values = [float(row[f"stage_{stage}_ms"]) for stage in stages]
            assert sum(values) == pytest.approx(float(row[measured]), abs=1), row
            assert min(values) >= -clock["uncertainty_ms"] - 1, row
    assert (out / "stages.png").read_bytes()[:8] == PNG and 'alt="stages"' in (out / "report.html").read_text()
    return summaries


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
    assert "ttft_ms" in text.stdout and "clock offset" in text.stdout
    stages = check_stages(tmp_path / "text", json.loads((tmp_path / "text" / "report.json").read_text()),
                          ("uplink", "llm_first_token", "downlink"), "ttft_ms")
    assert stages["uplink"]["max"] < 200 and stages["downlink"]["max"] < 200  # loopback

    before = chat_ttft_totals(gateway.url)
    chat = bench("--url", gateway.url, "--mode", "chat", "--model", MODEL, "--sessions", "2", "--turns", "2",
                 "--system-prompt-tokens", "200", "--out", str(tmp_path / "chat"))
    assert chat.returncode == 0, chat.stderr
    report = check_report(tmp_path / "chat", mode="chat", turns=4)
    # Chat Completions carry no latency marks: no stages, no clock, no plot of them.
    assert report["server_stages_ms"] == {} and report["clock_offset"] is None
    assert not (tmp_path / "chat" / "stages.png").exists()
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
        (["--url", secured_gateway.url, "--mode", "webrtc", "--model", MODEL, "--api-key", "sk-wrong"], "refused the key"),
        (["--url", secured_gateway.url, "--mode", "text", "--barge-in"], "--barge-in needs --mode voice"),
        (["--url", secured_gateway.url, "--mode", "voice", "--barge-in-after-ms", "100"], "needs --barge-in"),
        (["--url", secured_gateway.url, "--mode", "chat", "--audio", str(tmp_path)], "--audio needs --mode voice"),
    ]
    with realtime_server_without_calls() as url:
        cases.append((["--url", url, "--mode", "webrtc"], f"{url}/v1/realtime/calls answered 404, not 201 (not_found)"))
        for args, message in cases:
            run = bench(*args, "--out", str(tmp_path / "out"), timeout=60)
            assert run.returncode == 2, (args, run.stdout, run.stderr)
            assert message in run.stderr and "Traceback" not in run.stderr, (args, run.stderr)
            assert run.stderr.count("\n") == 1, run.stderr


class NoCalls(BaseHTTPRequestHandler):
    """A Realtime server without WebRTC: it mints client secrets, and has no /v1/realtime/calls."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        found = self.path == "/v1/realtime/client_secrets"
        body = json.dumps({"value": "ek_test"} if found else {"error": {"code": "not_found", "message": "no"}}).encode()
        self.send_response(200 if found else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextlib.contextmanager
def realtime_server_without_calls() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoCalls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
    stages = check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    # The VAD waits out its silence (400 ms, less the speech's own trailing quiet) before speech_stopped.
    assert 100 < stages["uplink_vad"]["p50"] < 1000 and stages["downlink"]["max"] < 200

    (folder / "bad.wav").write_bytes(b"RIFF....WAVEfmt not really")
    bad = bench("--url", gateway.url, "--mode", "voice", "--audio", str(folder), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr


def test_voice_barge_in_times_how_long_the_answer_goes_on(gateway: GatewayProcess, tmp_path: Path) -> None:
    """Each answer is interrupted by the next question, spoken 300 ms after the answer's first audio; long
    answers, so that the gateway is still at them (over the WebSocket it sends audio faster than real time)."""
    prompts = tmp_path / "long.txt"
    prompts.write_text("Tell me a long story.\nDescribe a big city.\n")
    run = bench("--url", gateway.url, "--mode", "voice", "--model", MODEL, "--sessions", "2", "--turns", "2",
                "--max-tokens", "100", "--prompt-file", str(prompts), "--barge-in", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="voice", turns=4)
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    # The gateway's VAD needs 160 ms of speech before it interrupts; then it stops within a step or two.
    assert 100 < barge_in["p50"] and barge_in["max"] < 2000, barge_in
    assert report["config"]["barge_in"] and report["config"]["barge_in_after_ms"] == 300
    check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")


def test_webrtc_calls_with_barge_in(gateway: GatewayProcess, tmp_path: Path) -> None:
    """A WebRTC call per session made as OpenAI's browser page makes it (aiortc here), spoken turns on its
    microphone track, answers heard on the gateway's track, each interrupted by the next question."""
    run = bench("--url", gateway.url, "--mode", "webrtc", "--model", MODEL, "--sessions", "2", "--turns", "2",
                "--max-tokens", "16", "--barge-in", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="webrtc", turns=4)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000 and report["audio_rtf"]["count"] == 0  # real time there
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    assert 100 < barge_in["p50"] and barge_in["max"] < 2000, barge_in
    stages = check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    assert stages["downlink"]["max"] < 1000  # playout, Opus, the receive jitter buffer, the answer's quiet start
