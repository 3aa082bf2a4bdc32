"""Voice-to-voice latency and barge-in over the Realtime WebSocket, with Piper speech; prints one JSON object.

    python -m benchmarks.voice                       # starts its own gateway on a free port
    python -m benchmarks.voice --url http://127.0.0.1:8000 --turns 10 --barge-in-runs 5 --sessions 2

What is measured (all clocks on this machine; the gateway's `gateway_latency.epoch_ms` is wall time):
- The "microphone" streams pcm16 24 kHz mono in 20 ms `input_audio_buffer.append` chunks, paced by the
  wall clock, without pause: silence between utterances, as a real microphone would. A sample is
  "spoken" at t0 + index / 24000 and its chunk is sent when the chunk is complete.
- Voice-to-voice: from the last speech sample of the question (found by energy, not the clip's end
  with Piper's trailing silence) to the first `response.output_audio.delta` received.
- Stages of the same turn, from the `response.done` latency marks; they add up to voice-to-voice
  (for a preempted turn, whose reply began generating from the speculative transcript before the
  final one existed, llm_first_token is ~0 and generation_head_start_ms says by how much it led):
  vad_stop_wait (end of speech -> the gateway's speech_stopped), asr (-> final transcript),
  response_start (-> response created), llm_first_token, first_clause_wait (-> the first clause of
  text is complete; when the gateway marks it), tts_first_audio (-> first audio handed to the
  socket: Piper), delivery (-> received here).
- Barge-in: a story is asked for; 1.5 s after its first audio arrives, "Wait, stop." is streamed.
  From the send time of the first non-silent chunk of that utterance to: the speech_started event
  (a WebSocket client flushes its playback there), the last audio delta of the story, and the
  story's `response.done` (status cancelled).
Turn detection is the gateway's default server_vad. One warm-up turn per session is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.voice_audio import Clip, Speaker
from benchmarks.voice_server import GatewayProcess, get_json

RATE = 24000
CHUNK = RATE // 50  # 20 ms
MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "What is the largest planet in our solar system?",
    "Which animal is known as the king of the jungle?",
]
WARMUP = "Hello, can you hear me?"
STORY = "Tell me a long story about a dragon."
STOP = "Wait, stop."
STORY_INSTRUCTIONS = (
    "You are a storyteller. When you are asked for a story, tell a long story of at least ten sentences. "
    "When you are asked to stop, answer in a few words."
)
STAGES = (
    "vad_stop_wait",
    "asr",
    "response_start",
    "llm_first_token",
    "first_clause_wait",
    "tts_first_audio",
    "delivery",
)
EVENT_TIMEOUT_S = 60.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary(values: list[float]) -> dict[str, Any]:
    """p50/p95 (linear interpolation), mean, min, max, n; ms rounded to 0.1."""
    if not values:
        return {"n": 0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(array, 50)), 1),
        "p95": round(float(np.percentile(array, 95)), 1),
        "mean": round(float(array.mean()), 1),
        "min": round(float(array.min()), 1),
        "max": round(float(array.max()), 1),
        "n": int(array.size),
    }


# -- the microphone ---------------------------------------------------------------------------------


@dataclass
class Said:
    """One utterance queued on the microphone; the futures resolve as it is streamed."""

    clip: Clip
    start_sample: int = -1  # index in the stream of the clip's first sample
    end_lag_ms: float = 0.0  # how late the chunk with the end of speech was sent (this process's lag)
    onset_sent: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    speech_end: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    finished: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def onset_ms(self) -> float:
        return 1000 * (self.start_sample + self.clip.onset) / RATE

    def end_ms(self) -> float:
        return 1000 * (self.start_sample + self.clip.end) / RATE


class Mic:
    """Streams 20 ms chunks forever, paced by the wall clock: queued utterances, else silence."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._queue: deque[Said] = deque()
        self.t0 = 0.0
        self.samples = 0
        self.max_lag_ms = 0.0

    def say(self, clip: Clip) -> Said:
        said = Said(clip)
        self._queue.append(said)
        return said

    async def run(self) -> None:
        silence = np.zeros(CHUNK, dtype=np.int16)
        current: Said | None = None
        pos = 0
        self.t0 = time.perf_counter()
        while True:
            if current is None and self._queue:
                current, pos = self._queue.popleft(), 0
                current.start_sample = self.samples
            if current is not None:
                piece = current.clip.pcm[pos : pos + CHUNK]
                if len(piece) < CHUNK:
                    piece = np.concatenate([piece, silence[: CHUNK - len(piece)]])
            else:
                piece = silence
            due = self.t0 + (self.samples + CHUNK) / RATE  # the chunk is complete: a microphone hands it over
            if (delay := due - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            ready_at = time.perf_counter()
            lag_ms = (ready_at - due) * 1000
            self.max_lag_ms = max(self.max_lag_ms, lag_ms)
            payload = base64.b64encode(np.ascontiguousarray(piece, dtype="<i2").tobytes()).decode("ascii")
            await self._send(json.dumps({"type": "input_audio_buffer.append", "audio": payload}))
            sent_at = time.perf_counter()
            if current is not None:
                clip = current.clip
                if pos <= clip.onset < pos + CHUNK:
                    current.onset_sent.set_result(sent_at)
                if pos < clip.end <= pos + CHUNK:
                    # The last speech sample, placed within its chunk; later than the sample clock
                    # says if this process fell behind (so a late send is not counted against the gateway).
                    current.speech_end.set_result(ready_at - (pos + CHUNK - clip.end) / RATE)
                    current.end_lag_ms = round(lag_ms, 1)
                pos += CHUNK
                if pos >= len(clip.pcm):
                    current.finished.set_result(sent_at)
                    current = None
            self.samples += CHUNK


# -- one Realtime session ---------------------------------------------------------------------------


class Session:
    def __init__(self, url: str, name: str, wall_offset: float) -> None:
        self.ws_url = (
            url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + f"/v1/realtime?model={MODEL}"
        )
        self.name = name
        self.wall_offset = wall_offset  # time.time() - time.perf_counter()
        self.events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.ws: Any = None
        self.mic: Mic | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.errors: list[dict[str, Any]] = []

    def wall_ms(self, perf: float) -> float:
        return (perf + self.wall_offset) * 1000

    async def __aenter__(self) -> Session:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.ws_url, max_size=None, open_timeout=30, ping_interval=None)
        self._tasks.append(asyncio.create_task(self._read(), name=f"{self.name} reader"))
        _, created = await self.expect("session.created", timeout=15)
        self.session = created["session"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)

    def start_mic(self) -> Mic:
        self.mic = Mic(self.ws.send)
        self._tasks.append(asyncio.create_task(self.mic.run(), name=f"{self.name} mic"))
        return self.mic

    async def _read(self) -> None:
        async for raw in self.ws:
            received = time.perf_counter()
            event = json.loads(raw)
            if event.get("type") == "response.output_audio.delta":
                # Keep the size, drop the payload: 2 bytes a sample once base64 is undone.
                event["samples"] = len(event.pop("delta", "")) * 3 // 8
            elif event.get("type") == "error":
                self.errors.append(event.get("error") or {})
            self.events.put_nowait((received, event))
        self.events.put_nowait((time.perf_counter(), {"type": "_closed"}))

    async def next(self, deadline: float) -> tuple[float, dict[str, Any]]:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        received, event = await asyncio.wait_for(self.events.get(), remaining)
        if event["type"] == "_closed":
            raise ConnectionError(f"{self.name}: the gateway closed the socket")
        return received, event

    async def expect(self, kind: str, timeout: float = EVENT_TIMEOUT_S) -> tuple[float, dict[str, Any]]:
        deadline = time.perf_counter() + timeout
        while True:
            received, event = await self.next(deadline)
            if event["type"] == kind:
                return received, event

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def quiet(self, seconds: float) -> None:
        """Drain events until none arrived for `seconds` (the previous turn is over)."""
        while True:
            try:
                await self.next(time.perf_counter() + seconds)
            except TimeoutError:
                return


@dataclass
class Response:
    id: str
    created: float
    first_audio: float | None = None
    last_audio: float | None = None
    audio_samples: int = 0
    text: str = ""
    done: float | None = None
    status: str | None = None
    reason: str | None = None
    marks: dict[str, Any] | None = None
    audio_after: dict[float, int] = field(default_factory=dict)  # receive time -> samples (barge-in)


class Tracker:
    """Folds one session's events into responses and input-audio marks."""

    def __init__(self) -> None:
        self.responses: dict[str, Response] = {}
        self.order: list[Response] = []
        self.speech_started: list[tuple[float, dict[str, Any]]] = []
        self.speech_stopped: list[tuple[float, dict[str, Any]]] = []
        self.transcripts: list[tuple[float, str]] = []
        self.errors: list[dict[str, Any]] = []

    def feed(self, received: float, event: dict[str, Any]) -> Response | None:
        """Returns the response an event finished, if it did."""
        kind = event["type"]
        if kind == "input_audio_buffer.speech_started":
            self.speech_started.append((received, event))
        elif kind == "input_audio_buffer.speech_stopped":
            self.speech_stopped.append((received, event))
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.transcripts.append((received, event.get("transcript", "")))
        elif kind == "response.created":
            response = Response(event["response"]["id"], received)
            self.responses[response.id] = response
            self.order.append(response)
        elif kind == "error":
            self.errors.append(event.get("error") or {})
        elif (response := self.responses.get(event.get("response_id") or "")) is not None:
            if kind == "response.output_audio.delta":
                response.first_audio = response.first_audio or received
                response.last_audio = received
                response.audio_samples += event["samples"]
                response.audio_after[received] = event["samples"]
            elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
                response.text += event.get("delta", "")
        if kind == "response.done":
            body = event["response"]
            response = self.responses.get(body["id"])
            if response is not None:
                response.done = received
                response.status = body.get("status")
                response.reason = (body.get("status_details") or {}).get("reason")
                response.marks = (body.get("metadata") or {}).get("gateway_latency")
                return response
        return None


# -- voice turns ------------------------------------------------------------------------------------


async def voice_turn(session: Session, clip: Clip) -> dict[str, Any]:
    """Say one question; wait for the answer's response.done; measure from the end of speech."""
    assert session.mic is not None
    tracker = Tracker()
    said = session.mic.say(clip)
    record: dict[str, Any] = {"question": clip.text}
    deadline = time.perf_counter() + EVENT_TIMEOUT_S
    answer: Response | None = None
    try:
        while answer is None:
            received, event = await session.next(deadline)
            done = tracker.feed(received, event)
            if done is None or not said.speech_end.done() or done.created < said.speech_end.result():
                continue
            if done.status == "cancelled" and done.reason == "turn_detected":
                continue  # the question was split in two turns; the answer to the rest follows
            answer = done
    except TimeoutError:
        record["error"] = "timed out waiting for the answer"
    except ConnectionError as exc:
        record["error"] = str(exc)
    record["speech_started_events"] = len(tracker.speech_started)
    record["end_send_lag_ms"] = said.end_lag_ms
    record["transcript"] = tracker.transcripts[-1][1] if tracker.transcripts else None
    if tracker.errors:
        record["errors"] = tracker.errors
    if tracker.speech_stopped and said.speech_end.done():
        # Where the gateway's VAD put the end, against where speech really ended in the stream.
        record["vad_end_error_ms"] = round(tracker.speech_stopped[-1][1]["audio_end_ms"] - said.end_ms(), 1)
    if answer is None:
        return record
    record.update(
        status=answer.status, answer=answer.text.strip(), answer_audio_s=round(answer.audio_samples / RATE, 2)
    )
    if answer.first_audio is None:
        record["error"] = f"no answer audio (status {answer.status})"
        return record
    end = said.speech_end.result()
    record["voice_to_voice_ms"] = round((answer.first_audio - end) * 1000, 1)
    marks = answer.marks or {}
    if marks.get("epoch_ms") is not None and all(
        marks.get(f"{m}_ms") is not None for m in ("transcript_final", "response_created", "first_token", "first_audio")
    ):
        origin = marks["epoch_ms"]  # wall ms of the gateway's speech_stopped
        record["stages_ms"] = {
            "vad_stop_wait": round(origin - session.wall_ms(end), 1),
            "asr": marks["transcript_final_ms"],
            "response_start": round(marks["response_created_ms"] - marks["transcript_final_ms"], 1),
            "llm_first_token": round(marks["first_token_ms"] - marks["response_created_ms"], 1),
            "tts_first_audio": round(
                marks["first_audio_ms"] - (marks.get("first_clause_ms") or marks["first_token_ms"]), 1
            ),
            "delivery": round(session.wall_ms(answer.first_audio) - (origin + marks["first_audio_ms"]), 1),
        }
        if marks.get("first_clause_ms") is not None:
            record["stages_ms"]["first_clause_wait"] = round(marks["first_clause_ms"] - marks["first_token_ms"], 1)
        started = marks.get("generation_started_ms")
        # Preempted: the reply's generation began from the speculative transcript, before the final one.
        record["preempted"] = started is not None and started < marks["transcript_final_ms"]
        if record["preempted"]:
            record["generation_head_start_ms"] = round(marks["transcript_final_ms"] - started, 1)
        record["gateway_latency"] = marks
    else:
        record["gateway_latency"] = marks or None
    return record


# -- barge-in ---------------------------------------------------------------------------------------


async def barge_in_run(session: Session, story: Clip, stop: Clip, after_s: float) -> dict[str, Any]:
    assert session.mic is not None
    tracker = Tracker()
    record: dict[str, Any] = {}
    asked = session.mic.say(story)
    deadline = time.perf_counter() + EVENT_TIMEOUT_S
    try:
        # 1. The story starts playing.
        story_response: Response | None = None
        while story_response is None or story_response.first_audio is None:
            received, event = await session.next(deadline)
            finished = tracker.feed(received, event)
            if story_response is None and asked.speech_end.done():
                story_response = next((r for r in tracker.order if r.created >= asked.speech_end.result()), None)
            if finished is not None and finished is story_response and finished.first_audio is None:
                record["error"] = f"the story ended ({finished.status}) with no audio"
                return record
        # 2. `after_s` after its first audio, the user starts talking over it.
        interrupt_at = story_response.first_audio + after_s
        while (wait := interrupt_at - time.perf_counter()) > 0:
            with contextlib.suppress(TimeoutError):
                tracker.feed(*await session.next(time.perf_counter() + wait))
        if story_response.done is not None:
            record["error"] = f"the story was over ({story_response.status}) before the interruption"
            record["story_audio_s"] = round(story_response.audio_samples / RATE, 2)
            return record
        said = session.mic.say(stop)
        # 3. Until the story's response.done, then until the reply to "Wait, stop." is done too.
        follow_up: Response | None = None
        while story_response.done is None or (follow_up is None or follow_up.done is None):
            try:
                received, event = await session.next(
                    min(deadline, time.perf_counter() + (8.0 if story_response.done else EVENT_TIMEOUT_S))
                )
            except TimeoutError:
                if story_response.done is None:
                    raise
                break  # no reply to the interruption (empty transcript): fine
            tracker.feed(received, event)
            if follow_up is None and story_response.done is not None:
                follow_up = next(
                    (r for r in tracker.order if r is not story_response and r.created > story_response.created), None
                )
        onset = await said.onset_sent
        record["story_status"] = story_response.status
        record["story_reason"] = story_response.reason
        record["stop_transcript"] = tracker.transcripts[-1][1] if tracker.transcripts else None
        started_events = [(t, e) for t, e in tracker.speech_started if t >= onset]
        started = [t for t, _ in started_events]
        record["speech_started_after_onset"] = len(started)  # > 1: the VAD split "Wait, stop." in two turns
        after = {t: n for t, n in story_response.audio_after.items() if t >= onset}
        last_audio = story_response.last_audio
        record["onset_to_speech_started_ms"] = round((started[0] - onset) * 1000, 1) if started else None
        record["onset_to_last_audio_ms"] = round((last_audio - onset) * 1000, 1) if last_audio is not None else None
        record["onset_to_response_done_ms"] = round((story_response.done - onset) * 1000, 1)
        record["audio_received_after_onset_ms"] = round(1000 * sum(after.values()) / RATE, 1)
        record["story_audio_s"] = round(story_response.audio_samples / RATE, 2)
        if started:
            record["vad_onset_error_ms"] = round(started_events[0][1]["audio_start_ms"] - said.onset_ms(), 1)
        if story_response.status != "cancelled":
            record["error"] = f"the story was not cancelled (status {story_response.status})"
    except TimeoutError:
        record["error"] = "timed out"
    except ConnectionError as exc:
        record["error"] = str(exc)
    if tracker.errors:
        record["errors"] = tracker.errors
    return record


# -- driver -----------------------------------------------------------------------------------------


@dataclass
class Workload:
    questions: list[Clip]
    warmup: Clip
    story: Clip
    stop: Clip
    turns: int
    barge_in_runs: int
    barge_in_after_s: float
    gap_s: float


async def run_worker(url: str, index: int, work: Workload, wall_offset: float, progress: Any) -> dict[str, Any]:
    await asyncio.sleep(index * 0.7)  # stagger concurrent sessions a little
    out: dict[str, Any] = {"turns": [], "barge_in": [], "mic_max_lag_ms": 0.0}
    if work.turns:
        async with Session(url, f"s{index}", wall_offset) as session:
            mic = session.start_mic()
            await session.quiet(0.5)
            warm = await voice_turn(session, work.warmup)
            progress(
                f"session {index} warm-up: {warm.get('voice_to_voice_ms')} ms {warm.get('error', '')}", advance=False
            )
            for turn in range(work.turns):
                await session.quiet(work.gap_s)
                record = await voice_turn(session, work.questions[turn % len(work.questions)])
                record["session"] = index
                out["turns"].append(record)
                progress(
                    f"session {index} turn {turn + 1}: v2v {record.get('voice_to_voice_ms')} ms, "
                    f"heard {record.get('transcript')!r} {record.get('error', '')}"
                )
            out["mic_max_lag_ms"] = max(out["mic_max_lag_ms"], round(mic.max_lag_ms, 1))
    if work.barge_in_runs:
        async with Session(url, f"b{index}", wall_offset) as session:
            await session.send(
                {"type": "session.update", "session": {"type": "realtime", "instructions": STORY_INSTRUCTIONS}}
            )
            await session.expect("session.updated", timeout=10)
            mic = session.start_mic()
            await session.quiet(0.5)
            # A story that ends before the interruption measures nothing: try again, up to twice as often.
            measured = attempts = 0
            while measured < work.barge_in_runs and attempts < 2 * work.barge_in_runs:
                attempts += 1
                await session.quiet(work.gap_s)
                record = await barge_in_run(session, work.story, work.stop, work.barge_in_after_s)
                record.update(session=index, attempt=attempts)
                out["barge_in"].append(record)
                ok = record.get("story_status") == "cancelled"
                measured += ok
                progress(
                    f"session {index} barge-in attempt {attempts}: speech_started {record.get('onset_to_speech_started_ms')} ms, "
                    f"last audio {record.get('onset_to_last_audio_ms')} ms, done {record.get('onset_to_response_done_ms')} ms "
                    f"{record.get('error', '')}",
                    advance=ok,
                )
            for _ in range(work.barge_in_runs - measured):
                progress(f"session {index}: barge-in run not measured", advance=True)
            out["mic_max_lag_ms"] = max(out["mic_max_lag_ms"], round(mic.max_lag_ms, 1))
    return out


def aggregate(
    results: list[dict[str, Any]], args: argparse.Namespace, health: Any, speech: dict[str, Any]
) -> dict[str, Any]:
    turns = [t for r in results for t in r["turns"]]
    runs = [b for r in results for b in r["barge_in"]]
    good = [t for t in turns if "voice_to_voice_ms" in t]
    staged = [t for t in good if "stages_ms" in t]
    stages = {name: summary([t["stages_ms"][name] for t in staged if name in t["stages_ms"]]) for name in STAGES}
    # Share of each stage in the same turn's voice-to-voice time, then the median over turns.
    shares = {}
    for name in STAGES:
        values = [100 * t["stages_ms"][name] / t["voice_to_voice_ms"] for t in staged if name in t["stages_ms"]]
        shares[name] = round(statistics.median(values), 1) if values else None
    cancelled = [b for b in runs if b.get("story_status") == "cancelled"]
    return {
        "benchmark": "voice",
        "transport": "websocket",
        "url": args.url,
        "sessions": args.sessions,
        "gateway": health,
        "input": {"format": "pcm16", "rate": RATE, "chunk_ms": 20, "paced": "wall clock", "speech": speech},
        "voice_to_voice_ms": summary([t["voice_to_voice_ms"] for t in good]),
        "stages_ms": stages,
        "stage_share_of_voice_to_voice_pct_median": shares,
        "vad_end_error_ms": summary([t["vad_end_error_ms"] for t in turns if "vad_end_error_ms" in t]),
        "turns_ok": len(good),
        "turns_total": len(turns),
        "turns_split_by_vad": sum(1 for t in turns if t.get("speech_started_events", 1) > 1),
        "turns_preempted": sum(1 for t in staged if t.get("preempted")),
        "generation_head_start_ms": summary([t["generation_head_start_ms"] for t in staged if t.get("preempted")]),
        "barge_in": {
            "after_first_audio_s": args.barge_in_after,
            "attempts": len(runs),
            "cancelled": len(cancelled),
            "story_over_before_interruption": sum(
                1 for b in runs if str(b.get("error", "")).startswith("the story was over")
            ),
            "runs_split_by_vad": sum(1 for b in cancelled if b.get("speech_started_after_onset", 0) > 1),
            "runs_with_error_events": sum(1 for b in runs if b.get("errors")),
            "onset_to_speech_started_ms": summary(
                [b["onset_to_speech_started_ms"] for b in cancelled if b.get("onset_to_speech_started_ms") is not None]
            ),
            # 0 when no story audio arrived after the onset (the gateway had already sent all it made).
            "onset_to_last_audio_ms": summary(
                [
                    max(0.0, b["onset_to_last_audio_ms"])
                    for b in cancelled
                    if b.get("onset_to_last_audio_ms") is not None
                ]
            ),
            "runs_with_audio_after_onset": sum(1 for b in cancelled if b.get("audio_received_after_onset_ms", 0) > 0),
            "onset_to_response_done_ms": summary([b["onset_to_response_done_ms"] for b in cancelled]),
            "audio_received_after_onset_ms": summary([b["audio_received_after_onset_ms"] for b in cancelled]),
            "vad_onset_error_ms": summary([b["vad_onset_error_ms"] for b in cancelled if "vad_onset_error_ms" in b]),
        },
        "mic_max_lag_ms": max((r["mic_max_lag_ms"] for r in results), default=0.0),
        "end_send_lag_ms": summary([t["end_send_lag_ms"] for t in turns if "end_send_lag_ms" in t]),
        "errors": [x for x in turns + runs if "error" in x],
        "turns": turns,
        "barge_in_runs": runs,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    gateway: GatewayProcess | None = None
    if args.url is None:
        log_path = Path(args.log or Path(tempfile.gettempdir()) / "benchmarks-voice-gateway.log")
        gateway = GatewayProcess(log_path).start()
        args.url = gateway.url
        console.print(f"starting the gateway on {gateway.url} (log: {log_path})")
    try:
        speaker = Speaker()
        clips = {text: speaker.say(text, RATE) for text in [*QUESTIONS, WARMUP, STORY, STOP]}
        speaker.close()
        if gateway is not None:
            await asyncio.to_thread(gateway.wait_ready, args.ready_timeout)
        status, health = get_json(f"{args.url}/healthz")
        if status != 200:
            raise RuntimeError(f"{args.url}/healthz answered {status}: {health}")
        work = Workload(
            questions=[clips[q] for q in QUESTIONS],
            warmup=clips[WARMUP],
            story=clips[STORY],
            stop=clips[STOP],
            turns=args.turns,
            barge_in_runs=args.barge_in_runs,
            barge_in_after_s=args.barge_in_after,
            gap_s=args.gap,
        )
        total = args.sessions * (args.turns + args.barge_in_runs)
        wall_offset = time.time() - time.perf_counter()
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar:
            task = bar.add_task("voice turns and barge-ins", total=total)

            def progress(message: str, advance: bool = True) -> None:
                bar.console.print(message)
                if advance:
                    bar.advance(task)

            results = await asyncio.gather(
                *(run_worker(args.url, i, work, wall_offset, progress) for i in range(args.sessions))
            )
        speech = {c.text: {"speech_s": round(c.speech_s, 2)} for c in clips.values()}
        return aggregate(list(results), args, health, speech)
    finally:
        if gateway is not None:
            gateway.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.voice", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway (http://host:port); default: start one on a free port")
    parser.add_argument("--turns", type=int, default=10, help="voice turns per session (default 10)")
    parser.add_argument("--barge-in-runs", type=int, default=5, help="measured barge-in runs per session (default 5)")
    parser.add_argument("--barge-in-after", type=float, default=1.5, help="seconds after the story's first audio (1.5)")
    parser.add_argument("--sessions", type=int, default=1, help="concurrent sessions, each doing the whole workload")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds with no event before the next utterance")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for a started gateway")
    parser.add_argument("--log", help="log file of a started gateway")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = asyncio.run(main_async(args))
    except (RuntimeError, TimeoutError, OSError) as exc:
        # The gateway did not start or could not be reached: still one JSON object on stdout.
        log(f"benchmark aborted: {exc}")
        print(json.dumps({"benchmark": "voice", "url": args.url, "error": str(exc).splitlines()[0]}, indent=2))
        return 2
    print(json.dumps(report, indent=2))
    return 0 if report["turns_ok"] or report["barge_in"]["cancelled"] else 1


if __name__ == "__main__":
    sys.exit(main())
