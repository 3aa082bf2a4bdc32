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
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import websockets

from benchmarks.openai_servers import transformers_serve as start_transformers_serve
from gateway.bench.runner import GRACE_S, SessionPlan
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.sip_peers import WEBHOOK_SECRET, free_port

METRIC_KEYS = {"count", "p50", "p90", "p95", "p99", "max", "mean"}
PNG = b"\x89PNG\r\n\x1a\n"
VOICE_STAGES = ("uplink_vad", "asr", "response_start", "llm_first_token", "llm_first_clause", "tts_first_audio",
                "downlink")


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def check_report(out: Path, *, mode: str, sessions: int, turns: int) -> dict:
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["mode"] == mode and report["turns"] == turns and report["turns_ok"] == turns, report
    assert report["sessions"] == sessions, report
    assert report["errors"] == {} and not report["interrupted"]
    for metric in ("ttft_ms", "first_audio_ms", "voice_to_voice_ms", "barge_in_ms", "itl_ms"):
        assert set(report[metric]) == METRIC_KEYS
    if mode != "live":  # Live's words follow its audio: they time nothing
        ttft = report["ttft_ms"]
        assert ttft["count"] == turns and 0 < ttft["p50"] <= ttft["p95"] <= ttft["max"] < 30_000
        assert report["itl_ms"]["count"] > turns and report["tokens_per_s"]["p50"] > 0
    assert report["overhead"]["loop_lag_ms"]["count"] > 0 and report["version"]
    lines = (out / "turns.csv").read_text().splitlines()
    assert len(lines) == turns + 1 and lines[0].startswith("session,turn,started_at,ttft_ms")
    with (out / "turns.csv").open() as f:
        assert all(row["question"].isdigit() for row in csv.DictReader(f))
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


def chat_ttft_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^gateway_chat_time_to_first_token_seconds_count (\S+)", text, re.M).group(1))


def served_chat_ttfts_ms(log_path: Path, after_bytes: int, count: int) -> list[float]:
    """The gateway's own TTFT (submitted to the engine -> first token) of each streamed chat completion it
    logged after the first `after_bytes` of its log, once there are `count` of them (a record may be written
    just after its stream's last chunk went out)."""
    deadline = time.monotonic() + 10
    while True:
        with log_path.open("rb") as f:
            f.seek(after_bytes)
            lines = f.read().decode(errors="replace").splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
        found = [r["ttft_ms"] for r in records if r.get("event") == "chat.completion" and r.get("stream")]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_text_and_chat_runs_write_their_report_and_compare(gateway: GatewayProcess, tmp_path: Path) -> None:
    text = bench("--url", gateway.url, "--mode", "text", "--model", MODEL, "--sessions", "2", "--turns", "2",
                 "--out", str(tmp_path / "text"))
    assert text.returncode == 0, text.stderr
    check_report(tmp_path / "text", mode="text", sessions=2, turns=4)
    assert "ttft_ms" in text.stdout and "clock offset" in text.stdout
    stages = check_stages(tmp_path / "text", json.loads((tmp_path / "text" / "report.json").read_text()),
                          ("uplink", "llm_first_token", "downlink"), "ttft_ms")
    # Loopback, clock-corrected: a wrong offset would put them seconds out. The bound is not a latency target
    # (benchmarks have those): a busy 2-core host's event loops have made a downlink of 1.5 s.
    assert stages["uplink"]["max"] < 10_000 and stages["downlink"]["max"] < 10_000

    before, log_size = chat_ttft_count(gateway.url), gateway.log_path.stat().st_size
    chat = bench("--url", gateway.url, "--mode", "chat", "--model", MODEL, "--sessions", "2", "--turns", "2",
                 "--system-prompt-tokens", "200", "--out", str(tmp_path / "chat"))
    assert chat.returncode == 0, chat.stderr
    report = check_report(tmp_path / "chat", mode="chat", sessions=2, turns=4)
    # Chat Completions carry no latency marks: no stages, no clock, no plot of them.
    assert report["server_stages_ms"] == {} and report["clock_offset"] is None
    assert not (tmp_path / "chat" / "stages.png").exists()
    # The independent measurement: the server's own TTFT of the same requests (the run's 4 streamed turns; its
    # preflight request is not streamed), from the gateway's log. Each client's TTFT spans its request's on the
    # server (sent before it was submitted, its first delta read after the first token was made), so, sorted,
    # each of the client's is at least the server's of the same rank, however busy the machine is. How much
    # more is the loopback and the two processes' scheduling: a benchmark's figure, not asserted here.
    served = sorted(served_chat_ttfts_ms(gateway.log_path, log_size, 4))
    assert chat_ttft_count(gateway.url) - before == 5  # the 4 turns and the preflight
    with (tmp_path / "chat" / "turns.csv").open() as f:
        turns = list(csv.DictReader(f))
    measured = sorted(float(row["ttft_ms"]) for row in turns)
    assert len(served) == 4 and all(c >= s - 1 for c, s in zip(measured, served, strict=True)), (measured, served)
    assert report["ttft_ms"]["mean"] == pytest.approx(sum(measured) / 4, abs=0.1)
    # TTFT is the first delta's time: that and the gaps after it fit in the turn's total time.
    for row in turns:
        gaps = float(row["itl_ms"] or 0) * (int(row["output_tokens"]) - 1)
        assert 0 < float(row["ttft_ms"]) and float(row["ttft_ms"]) + gaps <= float(row["total_ms"]) + 1, row

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
    check_report(tmp_path, mode="chat", sessions=2, turns=4)
    # Not a Realtime server: text mode says so in one line.
    refused = bench("--url", url, "--mode", "text", "--model", model, "--out", str(tmp_path / "no"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


CLOSED = "http://127.0.0.1:9"  # nothing listens there


def test_bad_input_is_one_line_and_exit_2(secured_gateway: GatewayProcess, tmp_path: Path) -> None:
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "bad.wav").write_bytes(b"RIFF....WAVEfmt not really")
    (tmp_path / "not-a-report.json").write_text('{"config": {}}')
    (tmp_path / "prompts.txt").write_text("Hi\n")
    cases = [
        (["--url", CLOSED, "--mode", "chat"], "cannot reach"),
        (["--url", CLOSED, "--mode", "text"], "cannot open ws://127.0.0.1:9/v1/realtime"),
        (["--url", CLOSED, "--mode", "voice"], "cannot open ws://127.0.0.1:9/v1/realtime"),
        (["--url", CLOSED, "--mode", "webrtc"], "cannot reach http://127.0.0.1:9"),
        (["--url", CLOSED, "--mode", "live"], "cannot open ws://127.0.0.1:9/v1/live/sessions"),
        (["--url", secured_gateway.url, "--mode", "chat", "--model", MODEL, "--api-key", "sk-wrong"], "refused the key"),
        (["--url", secured_gateway.url, "--mode", "text", "--model", MODEL, "--api-key", "sk-wrong"], "refused"),
        (["--url", secured_gateway.url, "--mode", "voice", "--model", MODEL, "--api-key", "sk-wrong"],
         "the server refused the session: invalid_api_key"),
        (["--url", secured_gateway.url, "--prompt-file", str(tmp_path / "missing.txt")], "cannot read --prompt-file"),
        (["--url", "ftp://example"], "must start with http"),
        (["--url", secured_gateway.url, "--sessions", "0"], "--sessions"),
        (["--compare", str(tmp_path / "missing.json")], "cannot read"),
        (["--compare", str(tmp_path / "not-a-report.json")], "is not a report.json of gateway bench"),
        (["--compare", str(tmp_path / "not-a-report.json"), "--url", CLOSED, "--mode", "voice"],
         "--compare runs nothing: it takes only --out, not --mode, --url"),
        (["--url", secured_gateway.url, "--mode", "webrtc", "--model", MODEL, "--api-key", "sk-wrong"], "refused the key"),
        (["--url", secured_gateway.url, "--mode", "text", "--barge-in"], "--barge-in needs --mode voice"),
        (["--url", secured_gateway.url, "--mode", "voice", "--barge-in-after-ms", "100"], "needs --barge-in"),
        (["--url", secured_gateway.url, "--mode", "webrtc", "--listen"], "--listen needs --mode voice"),
        (["--url", secured_gateway.url, "--mode", "chat", "--audio", str(tmp_path)], "--audio needs --mode voice"),
        (["--url", CLOSED, "--mode", "voice", "--audio", str(unreadable)], f"cannot read {unreadable / 'bad.wav'}"),
        (["--url", CLOSED, "--mode", "voice", "--audio", str(unreadable), "--prompt-file", str(tmp_path / "prompts.txt")],
         "--prompt-file has no use with it"),
    ]
    with realtime_server_without_calls() as url, fake_realtime(first="hello") as not_realtime:
        cases.append((["--url", url, "--mode", "webrtc"], f"{url}/v1/realtime/calls answered 404, not 201 (not_found)"))
        cases.append((["--url", not_realtime, "--mode", "text"],
                      "not a Realtime server: its first event was not a JSON object"))
        for args, message in cases:
            run = bench(*args, "--out", str(tmp_path / "out"), timeout=60)
            assert run.returncode == 2, (args, run.stdout, run.stderr)
            assert message in run.stderr and "Traceback" not in run.stderr, (args, run.stderr)
            assert run.stderr.count("\n") == 1, run.stderr
    assert not (tmp_path / "out").exists()  # no run, no report


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


class FakeChatServer(ThreadingHTTPServer):
    """Chat Completions without a model: a plain completion for the preflight, and streams as `kind` says:
    "quick" (one delta), "slow" (a delta every 0.2 s for a minute) or "every_other_malformed" (the odd
    streams' line is not JSON). It records each stream's request, and when each slow one was dropped."""

    def __init__(self, kind: str) -> None:
        super().__init__(("127.0.0.1", 0), FakeChat)
        self.kind = kind
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # the streams' bodies, in order
        self.dropped_at: list[float] = []  # time.monotonic() when a slow stream's client went away


class FakeChat(BaseHTTPRequestHandler):
    server: FakeChatServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        if not body.get("stream"):
            reply = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            return
        with self.server.lock:
            self.server.requests.append(body)
            number = len(self.server.requests)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection does
        if self.server.kind == "every_other_malformed" and number % 2:
            self.wfile.write(b"data: {not json\n\n")
            return
        delta = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
        try:
            for _ in range(300 if self.server.kind == "slow" else 1):
                self.wfile.write(delta)
                self.wfile.flush()
                if self.server.kind == "slow":
                    time.sleep(0.2)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            with self.server.lock:
                self.server.dropped_at.append(time.monotonic())

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextlib.contextmanager
def fake_chat(kind: str) -> Iterator[tuple[str, FakeChatServer]]:
    server = FakeChatServer(kind)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def fake_realtime(first: str, answer: tuple[str, ...] = ()) -> Iterator[str]:
    """A WebSocket server that sends `first` when a client connects, and `answer` to each response.create."""
    from websockets.sync.server import ServerConnection, serve

    def handler(connection: ServerConnection) -> None:
        connection.send(first)
        with contextlib.suppress(websockets.ConnectionClosed):
            for message in connection:
                if json.loads(message).get("type") == "response.create":
                    for event in answer:
                        connection.send(event)

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        finally:
            server.shutdown()


def wait_until(condition: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_malformed_response_fails_its_turn_and_the_run_goes_on(tmp_path: Path) -> None:
    """Chat: the session's next turn is a request of its own. Realtime: the session ends (its events are
    out of step), the others go on."""
    with fake_chat("every_other_malformed") as (url, _):
        run = bench("--url", url, "--mode", "chat", "--sessions", "2", "--turns", "2", "--out", str(tmp_path / "chat"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "chat" / "report.json").read_text())
    assert report["errors"] == {"bad_response": 2} and report["turns"] == 4 and report["turns_ok"] == 2, report
    assert report["sessions"] == 2

    created = json.dumps({"type": "session.created", "session": {}})
    answer = (json.dumps({"type": "response.created", "response": {"id": "r"}}),
              json.dumps({"type": "error", "error": "not an object"}))
    with fake_realtime(first=created, answer=answer) as url:
        run = bench("--url", url, "--mode", "text", "--sessions", "2", "--turns", "3", "--out", str(tmp_path / "text"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "text" / "report.json").read_text())
    assert report["errors"] == {"bad_response": 2} and report["turns"] == 2 and report["sessions"] == 2, report


@pytest.fixture(scope="module")
def capped_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """At most 2 sessions per key (callers without a key share one), text only."""
    process = start_gateway("--max-sessions-per-key", "2", "--no-load-voice-models",
                            log_path=tmp_path_factory.mktemp("capped") / "gateway.log")
    yield process
    process.stop()


def test_sessions_refused_mid_run_are_counted_and_the_others_run(capped_gateway: GatewayProcess, tmp_path: Path) -> None:
    run = bench("--url", capped_gateway.url, "--mode", "text", "--model", MODEL, "--sessions", "4", "--turns", "2",
                "--max-tokens", "8", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # 2 refused; 3 when the preflight's session was not yet closed on the server's side.
    refused = report["errors"].get("too_many_sessions", 0)
    assert report["errors"] == {"too_many_sessions": refused} and refused in (2, 3), report
    assert report["sessions"] == 4 and report["turns_ok"] == 2 * (4 - refused), report
    assert report["turns"] == report["turns_ok"] + refused and not report["interrupted"]


def test_duration_without_turns_takes_turns_until_it_ends(tmp_path: Path) -> None:
    with fake_chat("quick") as (url, _):
        run = bench("--url", url, "--mode", "chat", "--sessions", "2", "--duration", "2", "--out", str(tmp_path / "a"))
        both = bench("--url", url, "--mode", "chat", "--sessions", "2", "--duration", "30", "--turns", "2",
                     "--out", str(tmp_path / "b"))
    assert run.returncode == 0 and both.returncode == 0, (run.stderr, both.stderr)
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["config"]["turns"] is None and report["turns"] > 2 * 3 and report["duration_s"] >= 2, report
    with (tmp_path / "a" / "turns.csv").open() as f:
        # No turn starts once the 2 s are up (a start just before them is written rounded to the ms: 2.0).
        assert max(float(row["started_at"]) for row in csv.DictReader(f)) <= 2
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["turns"] == 4 and report["duration_s"] < 30  # the turns ran out first


def test_the_seed_repeats_each_sessions_questions_and_think_times(tmp_path: Path) -> None:
    def questions(out: Path) -> list[tuple[str, str, str]]:
        with (out / "turns.csv").open() as f:
            return sorted((row["session"], row["turn"], row["question"]) for row in csv.DictReader(f))

    options = ("--mode", "chat", "--sessions", "3", "--turns", "4", "--think-time", "0.05")
    with fake_chat("quick") as (url, server):
        for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
            run = bench("--url", url, *options, "--seed", seed, "--out", str(tmp_path / name))
            assert run.returncode == 0, run.stderr
        seeded = [request.get("seed") for request in server.requests]
        unseeded = bench("--url", url, *options, "--out", str(tmp_path / "d"))
        assert unseeded.returncode == 0, unseeded.stderr
        assert all("seed" not in request for request in server.requests[len(seeded):])
    assert seeded == [5] * 24 + [6] * 12  # chat mode: the server's sampling too
    assert questions(tmp_path / "a") == questions(tmp_path / "b") != questions(tmp_path / "c")
    assert len({question for _, _, question in questions(tmp_path / "a")}) > 1
    # Without --seed the workload is seed 0's (the default questions: 6), and no seed goes to the server.
    assert questions(tmp_path / "d") == sorted((str(session), str(turn), str(SessionPlan(0, session, 6).question(turn)))
                                               for session in range(3) for turn in range(4))


def test_ctrl_c_still_writes_the_report_of_what_finished(gateway: GatewayProcess, tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "gateway", "bench", "--url", gateway.url, "--mode", "text",
                                "--model", MODEL, "--sessions", "2", "--turns", "1000", "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # started, and some turns done
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["interrupted"] and 0 < report["turns_ok"] < 2000 and report["sessions"] == 2


def interrupt_slow_turns(tmp_path: Path, presses: int) -> tuple[float, dict]:
    """Ctrl-C (`presses` times, 0.3 s apart) while two chat turns stream for a minute: how long after the first
    press the server saw them dropped, and the report."""
    with fake_chat("slow") as (url, server):
        process = subprocess.Popen([sys.executable, "-m", "gateway", "bench", "--url", url, "--mode", "chat",
                                    "--sessions", "2", "--turns", "3", "--out", str(tmp_path)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: len(server.requests) == 2)
            pressed = time.monotonic()
            for press in range(presses):
                time.sleep(0.3 * bool(press))
                process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=GRACE_S + 30)
        finally:
            process.kill()
        assert process.returncode == 0, stderr
        wait_until(lambda: len(server.dropped_at) == 2, timeout_s=5)
        dropped = max(server.dropped_at) - pressed
    return dropped, json.loads((tmp_path / "report.json").read_text())


def test_ctrl_c_gives_the_turns_under_way_a_grace_and_a_second_one_cancels_them_at_once(tmp_path: Path) -> None:
    dropped, report = interrupt_slow_turns(tmp_path / "once", presses=1)
    assert GRACE_S - 0.2 < dropped < GRACE_S + 2, dropped
    assert report["interrupted"] and report["turns"] == 0  # the cancelled turns did not finish: not in it
    dropped, report = interrupt_slow_turns(tmp_path / "twice", presses=2)
    assert dropped < 2 < GRACE_S, dropped
    assert report["interrupted"] and report["turns"] == 0


def test_voice_mode_times_voice_to_voice_from_wav_files(gateway: GatewayProcess, tmp_path: Path, tts,
                                                          question_pcm) -> None:
    """Spoken turns at real-time pace with server VAD, from a folder of WAV files (44.1 kHz stereo here:
    the bench converts); the default, Piper speaking the built-in questions, is what docs/benchmarks.md runs."""
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
    report = check_report(tmp_path / "out", mode="voice", sessions=2, turns=4)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000 and report["first_audio_ms"]["count"] == 4
    assert report["audio_rtf"]["count"] == 4 and 0 < report["audio_rtf"]["p50"] < 1  # faster than real time
    assert report["audio_stall_ms"]["count"] == 4 and report["audio_stall_ms"]["max"] >= 0
    stages = check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    # The VAD waits out its silence (400 ms, less the speech's own trailing quiet) before speech_stopped.
    assert 100 < stages["uplink_vad"]["p50"] < 1000 and 0 <= stages["downlink"]["max"] < 10_000  # not a target

    (folder / "bad.wav").write_bytes(b"RIFF....WAVEfmt not really")
    bad = bench("--url", gateway.url, "--mode", "voice", "--audio", str(folder), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "cannot read" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_voice_barge_in_times_how_long_the_answer_goes_on(gateway: GatewayProcess, tmp_path: Path) -> None:
    """Each answer is interrupted by the next question, spoken 300 ms after the answer's first audio; long
    answers, so that the gateway is still at them (over the WebSocket it sends audio faster than real time)."""
    prompts = tmp_path / "long.txt"
    prompts.write_text("Tell me a long story.\nDescribe a big city.\n")
    run = bench("--url", gateway.url, "--mode", "voice", "--model", MODEL, "--sessions", "2", "--turns", "2",
                "--max-tokens", "100", "--prompt-file", str(prompts), "--barge-in", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="voice", sessions=2, turns=4)
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    # The gateway's VAD needs 160 ms of speech before it interrupts; then it stops within a step or two.
    assert 100 < barge_in["p50"] and barge_in["max"] < 2000, barge_in
    assert report["config"]["barge_in"] and report["config"]["barge_in_after_ms"] == 300
    check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")


def test_live_sessions_with_barge_in(gateway: GatewayProcess, tmp_path: Path) -> None:
    """GPT-Live sessions (/v1/live/sessions) with spoken turns, each answer interrupted by the next question: the
    answers are marked from their audio, which the server paces in real time; Live has no latency marks."""
    prompts = tmp_path / "long.txt"
    # Answers of a few sentences: long enough to be cut 300 ms into their audio, and short when one is not cut
    # (a missed barge-in played a 256-token story out in real time: 3 minutes on a busy 2-core host).
    prompts.write_text("Describe a big city in three sentences.\nTell me about the sea in three sentences.\n")
    run = bench("--url", gateway.url, "--mode", "live", "--sessions", "2", "--turns", "2", "--prompt-file",
                str(prompts), "--barge-in", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="live", sessions=2, turns=4)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000 and report["ttft_ms"]["count"] == 0
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    assert 0 < barge_in["p50"] and barge_in["max"] < 2000, barge_in


def test_webrtc_calls_with_barge_in(gateway: GatewayProcess, tmp_path: Path) -> None:
    """A WebRTC call per session made as OpenAI's browser page makes it (aiortc here), spoken turns on its
    microphone track, answers heard on the gateway's track, each interrupted by the next question."""
    run = bench("--url", gateway.url, "--mode", "webrtc", "--model", MODEL, "--sessions", "2", "--turns", "2",
                "--max-tokens", "16", "--barge-in", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="webrtc", sessions=2, turns=4)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000 and report["audio_rtf"]["count"] == 0  # real time there
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    assert 100 < barge_in["p50"] and barge_in["max"] < 2000, barge_in
    stages = check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    # Playout, Opus, the receive jitter buffer, the answer's quiet start: seconds would mean a stage is misplaced;
    # its latency is the benchmark's to report, which a busy host's event loops stretch.
    assert 0 <= stages["downlink"]["max"] < 10_000


@pytest.mark.parametrize("carrier", ["twilio", "telnyx", "plivo"])
def test_carrier_calls(gateway: GatewayProcess, tmp_path: Path, carrier: str) -> None:
    """A phone call per session through a carrier's media stream, the bench standing in for the carrier: spoken
    turns as 8 kHz mu-law, answers played as the carrier plays them (marks echoed), events on the call's sideband;
    the downlink's pacing is in the report. (Barge-in over it: tests/integration/test_carrier_streams.py.)"""
    run = bench("--url", gateway.url, "--mode", carrier, "--model", MODEL, "--sessions", "2", "--turns", "1",
                "--max-tokens", "16", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode=carrier, sessions=2, turns=2)
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 2 and 0 < v2v["p50"] < 10_000
    check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    links = report["downlink"]
    assert len(links) == 2 and all(link["media_messages"] > 0 and link["loud_audio_s"] > 0 for link in links), links
    assert all(link["stray_loud_audio_ms"] == 0 for link in links), links  # every loud frame was some answer's


@pytest.fixture(scope="module")
def sip_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str, str]]:
    """A gateway with a SIP trunk whose webhooks go where the bench will take them: (gateway, the trunk's
    HOST:PORT, the webhooks' HOST:PORT)."""
    sip, webhooks = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port(socket.SOCK_STREAM)}"
    process = start_gateway("--sip-listen", sip, "--webhook-url", f"http://{webhooks}/hooks",
                            "--webhook-secret", WEBHOOK_SECRET, "--sip-answer-timeout-s", "5",
                            log_path=tmp_path_factory.mktemp("sip") / "gateway.log")
    yield process, sip, webhooks
    process.stop()


def test_sip_calls_with_barge_in(sip_gateway: tuple[GatewayProcess, str, str], tmp_path: Path) -> None:
    """A SIP call per session, the bench as the caller (INVITE, PCMU over RTP every 20 ms) and as the application
    (the signed webhook checked with the openai SDK, the call accepted with client.realtime.calls' route, events
    on its sideband); each answer interrupted by the next question; the downlink's RTP figures in the report."""
    gateway, sip, webhooks = sip_gateway
    run = bench("--url", gateway.url, "--mode", "sip", "--sip", sip, "--webhook-listen", webhooks, "--webhook-secret",
                WEBHOOK_SECRET, "--model", MODEL, "--sessions", "2", "--turns", "2", "--max-tokens", "16", "--barge-in",
                "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    report = check_report(tmp_path / "out", mode="sip", sessions=2, turns=4)
    assert report["config"]["sip"] == sip and report["config"]["webhook_listen"] == webhooks
    v2v = report["voice_to_voice_ms"]
    assert v2v["count"] == 4 and 0 < v2v["p50"] < 10_000
    barge_in = report["barge_in_ms"]
    assert barge_in["count"] > 0 and barge_in["count"] + report["barge_in_missed"] == 4, report
    assert barge_in["max"] < 2000, barge_in
    check_stages(tmp_path / "out", report, VOICE_STAGES, "voice_to_voice_ms")
    links = report["downlink"]
    assert len(links) == 2, links
    for link in links:  # a packet every 20 ms for the whole call, none lost on loopback, every loud frame an answer's
        assert link["rtp_packets_received"] > 100 and link["rtp_packets_lost"] == 0, link
        assert link["loud_audio_s"] > 0 and link["stray_loud_audio_ms"] == 0, link
    assert "Traceback" not in run.stderr, run.stderr


def test_sip_mode_refusals(sip_gateway: tuple[GatewayProcess, str, str], tmp_path: Path) -> None:
    """What --mode sip cannot do is said in one line: a missing secret, a bad address, a SIP address where
    nothing answers, and webhooks the gateway signs with another secret (it refuses the call at its deadline)."""
    gateway, sip, webhooks = sip_gateway
    closed = f"127.0.0.1:{free_port()}"
    other_secret = "whsec_" + "b3RoZXItc2VjcmV0LW5vdC10aGUtZ2F0ZXdheXM="
    cases = [
        (["--mode", "sip", "--sip", sip], "--mode sip needs --webhook-secret"),
        (["--mode", "sip", "--sip", "nowhere", "--webhook-secret", WEBHOOK_SECRET], "--sip must be HOST:PORT"),
        (["--mode", "voice", "--sip", sip], "--sip needs --mode sip"),
        (["--mode", "sip", "--sip", closed, "--webhook-listen", webhooks, "--webhook-secret", WEBHOOK_SECRET],
         f"{closed} did not answer the INVITE"),
        (["--mode", "sip", "--sip", sip, "--webhook-listen", webhooks, "--webhook-secret", other_secret],
         "refused the call (480"),
    ]
    with socket.socket() as taken:  # a port another program listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        cases.append((["--mode", "sip", "--sip", sip, "--webhook-listen", busy, "--webhook-secret", WEBHOOK_SECRET],
                      f"cannot take webhooks on {busy} (--webhook-listen)"))
        for args, message in cases:
            run = bench("--url", gateway.url, *args, "--out", str(tmp_path / "out"), timeout=90)
            assert run.returncode == 2, (args, run.stdout, run.stderr)
            assert message in run.stderr and "Traceback" not in run.stderr, (args, run.stderr)
            assert run.stderr.count("\n") == 1, run.stderr
    assert not (tmp_path / "out").exists()
