"""Voice-to-voice latency and barge-in over the Realtime WebSocket or a WebRTC call, with Piper speech; one JSON object.

    python -m benchmarks.voice                       # WebSocket; starts its own gateway on a free port
    python -m benchmarks.voice --transport webrtc    # the same workload over a WebRTC call made with aiortc
    python -m benchmarks.voice --url http://127.0.0.1:8000 --turns 10 --barge-in-runs 5 --sessions 2

What is measured (all clocks on this machine; the gateway's `gateway_latency.epoch_ms` is wall time):
- The "microphone" streams 20 ms chunks paced by the wall clock, without pause: silence between
  utterances, as a real microphone would. A sample is "spoken" at t0 + index / rate, and its chunk
  leaves when it is complete. WebSocket: pcm16 24 kHz `input_audio_buffer.append` events. WebRTC: a
  48 kHz track, each frame returned to aiortc (which encodes it to Opus and sends it) when complete.
- Voice-to-voice: from the last speech sample of the question (found by energy, not the clip's end
  with Piper's trailing silence; placed within its chunk) to the answer's first audio received.
  WebSocket: the first `response.output_audio.delta`. WebRTC: the first loud 20 ms frame (RMS > 300)
  on the gateway's track, which plays silence between replies (the server decides what the caller
  hears).
- Stages of the same turn, from the `response.done` latency marks; they add up to voice-to-voice
  (for a preempted turn, whose reply began generating from the speculative transcript before the
  final one existed, llm_first_token is ~0 and generation_head_start_ms says by how much it led):
  vad_stop_wait (end of speech -> the gateway's speech_stopped), asr (-> final transcript),
  response_start (-> response created), llm_first_token, first_clause_wait (-> the first clause of
  text is complete; when the gateway marks it), tts_first_audio (-> first audio handed to the
  socket or queued for the WebRTC track: Piper), delivery (-> received here; over WebRTC: the
  track's next frame, Opus, RTP, decoding, and this caller's aiortc receive jitter buffer, which
  hands a frame on once 4 more have arrived: 80 ms; the gateway waits for 1, see
  --webrtc-audio-reorder-frames).
- Barge-in: a story is asked for; 1.5 s after its first audio arrives, "Wait, stop." is streamed.
  From the time the chunk with the first speech of that utterance left to: the speech_started
  event (a WebSocket client flushes its playback there), the last audio of the story received
  (over WebRTC, where the gateway stops the audio, this is when the caller stops hearing it),
  `output_audio_buffer.cleared` (WebRTC), and the story's `response.done` (status cancelled; over
  WebRTC a story already generated may still be playing: its cleared audio counts as interrupted).
  Each barge-in run has a session of its own.
- WebRTC: a loud frame is audio of the oldest response still playing (one plays at a time): from
  its response.created until 0.5 s with no loud frame after its output_audio_buffer.stopped or
  .cleared (frames in flight). Its response.done (sent when everything is generated, often before
  it is heard) is handed on after that stopped/cleared event, with its own arrival time: a turn is
  over once its answer has played. Durations of audio (answer_audio_s, story_audio_s,
  audio_received_after_onset_ms) count loud frames, an answer's until its stopped event. Also:
  output_audio_buffer.started -> first loud frame (the media path), cleared -> last loud frame
  (audio in flight), and per call the frames' inter-arrival times, aiortc's RTP jitter, loss, RTT.
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
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from benchmarks.voice_audio import Clip, Speaker
from gateway.platform.processes import GatewayProcess, get_json

WS_RATE = 24000  # pcm16 over the WebSocket
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
# Events that carry audio of a response, with its duration in "audio_ms": deltas over the WebSocket,
# loud frames received on the WebRTC track (a synthetic event made by benchmarks.voice_rtc).
AUDIO_EVENTS = ("response.output_audio.delta", "_audio")


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
    end_lag_ms: float = 0.0  # how late the chunk with the end of speech was ready (this process's lag)
    onset_sent: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    speech_end: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def onset_ms(self) -> float:
        return 1000 * (self.start_sample + self.clip.onset) / self.clip.rate

    def end_ms(self) -> float:
        return 1000 * (self.start_sample + self.clip.end) / self.clip.rate


class Mic:
    """A microphone's stream in 20 ms chunks, paced by the wall clock, without pause: queued utterances, else silence.

    The transport takes each chunk with `next_chunk()`, which returns when the chunk is complete (a
    microphone hands it over then), and calls `handed_over()` once it has passed it on.
    """

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.chunk = rate // 50
        self._queue: deque[Said] = deque()
        self._current: Said | None = None
        self._pos = 0  # samples of the current clip already handed over
        self._t0: float | None = None
        self.samples = 0  # samples handed over since _t0
        self.max_lag_ms = 0.0

    def say(self, clip: Clip) -> Said:
        if clip.rate != self.rate:
            raise ValueError(f"a {clip.rate} Hz clip on a {self.rate} Hz microphone")
        said = Said(clip)
        self._queue.append(said)
        return said

    async def next_chunk(self) -> np.ndarray:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        if self._current is None and self._queue:
            self._current, self._pos = self._queue.popleft(), 0
            self._current.start_sample = self.samples
        piece = np.zeros(self.chunk, dtype=np.int16)
        if (said := self._current) is not None:
            speech = said.clip.pcm[self._pos : self._pos + self.chunk]
            piece[: len(speech)] = speech
        due = self._t0 + (self.samples + self.chunk) / self.rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        ready_at = time.perf_counter()
        lag_ms = (ready_at - due) * 1000
        self.max_lag_ms = max(self.max_lag_ms, lag_ms)
        if said is not None and self._pos < said.clip.end <= self._pos + self.chunk:
            # The last speech sample, placed within its chunk; later than the sample clock says if
            # this process fell behind (so a late chunk is not counted against the gateway).
            said.speech_end.set_result(ready_at - (self._pos + self.chunk - said.clip.end) / self.rate)
            said.end_lag_ms = round(lag_ms, 1)
        return piece

    def handed_over(self, at: float) -> None:
        """The chunk from `next_chunk()` left for the gateway at `at` (perf_counter)."""
        said = self._current
        if said is not None:
            if self._pos <= said.clip.onset < self._pos + self.chunk:
                said.onset_sent.set_result(at)
            self._pos += self.chunk
            if self._pos >= len(said.clip.pcm):
                self._current = None
        self.samples += self.chunk


# -- one Realtime session ---------------------------------------------------------------------------


class EventStream(ABC):
    """One Realtime session as voice_turn and barge_in_run see it: timed events in arrival order, a microphone."""

    def __init__(self, name: str, wall_offset: float) -> None:
        self.name = name
        self.wall_offset = wall_offset  # time.time() - time.perf_counter()
        self.events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.mic: Mic | None = None
        self._tasks: list[asyncio.Task[None]] = []  # cancelled and awaited on close

    async def __aenter__(self) -> Self:
        try:
            await self._open()
            await self.expect("session.created", timeout=15)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @abstractmethod
    async def _open(self) -> None:
        """Connect; session.created is awaited after."""

    @abstractmethod
    async def _close(self) -> None:
        """Disconnect (the session's tasks are cancelled and awaited after)."""

    @abstractmethod
    def start_mic(self) -> Mic: ...

    @abstractmethod
    async def send(self, event: dict[str, Any]) -> None: ...

    async def link_stats(self) -> dict[str, Any] | None:
        """What the transport can tell about its own delays, if anything."""
        return None

    def wall_ms(self, perf: float) -> float:
        return (perf + self.wall_offset) * 1000

    async def next(self, deadline: float) -> tuple[float, dict[str, Any]]:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        received, event = await asyncio.wait_for(self.events.get(), remaining)
        if event["type"] == "_closed":
            raise ConnectionError(f"{self.name}: the gateway ended the session")
        return received, event

    async def expect(self, kind: str, timeout: float = EVENT_TIMEOUT_S) -> tuple[float, dict[str, Any]]:
        deadline = time.perf_counter() + timeout
        while True:
            received, event = await self.next(deadline)
            if event["type"] == kind:
                return received, event

    async def quiet(self, seconds: float) -> None:
        """Drain events until none arrived for `seconds` (the previous turn is over)."""
        while True:
            try:
                await self.next(time.perf_counter() + seconds)
            except TimeoutError:
                return


class WebSocketSession(EventStream):
    """Over the Realtime WebSocket: the microphone sends `input_audio_buffer.append`, the audio comes as deltas."""

    def __init__(self, url: str, name: str, wall_offset: float) -> None:
        super().__init__(name, wall_offset)
        self.ws_url = (
            url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + f"/v1/realtime?model={MODEL}"
        )
        self.ws: Any = None

    async def _open(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.ws_url, max_size=None, open_timeout=30, ping_interval=None)
        self._tasks.append(asyncio.create_task(self._read(), name=f"{self.name} reader"))

    async def _close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), 5)

    def start_mic(self) -> Mic:
        self.mic = Mic(WS_RATE)
        self._tasks.append(asyncio.create_task(self._stream(self.mic), name=f"{self.name} mic"))
        return self.mic

    async def _stream(self, mic: Mic) -> None:
        while True:
            pcm = await mic.next_chunk()
            payload = base64.b64encode(np.ascontiguousarray(pcm, dtype="<i2").tobytes()).decode("ascii")
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": payload}))
            mic.handed_over(time.perf_counter())

    async def _read(self) -> None:
        async for raw in self.ws:
            received = time.perf_counter()
            event = json.loads(raw)
            if event.get("type") == "response.output_audio.delta":
                # Keep the duration, drop the payload: 2 bytes a sample once base64 is undone.
                event["audio_ms"] = 1000 * (len(event.pop("delta", "")) * 3 // 8) / WS_RATE
            self.events.put_nowait((received, event))
        self.events.put_nowait((time.perf_counter(), {"type": "_closed"}))

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))


@dataclass
class Response:
    id: str
    created: float
    playout_started: float | None = None  # output_audio_buffer.started (WebRTC: the gateway's track took it)
    first_audio: float | None = None
    last_audio: float | None = None
    audio_ms: float = 0.0
    text: str = ""
    done: float | None = None
    status: str | None = None
    reason: str | None = None
    marks: dict[str, Any] | None = None
    audio_after: dict[float, float] = field(default_factory=dict)  # receive time -> ms of audio (barge-in)


class Tracker:
    """Folds one session's events into responses and input-audio marks."""

    def __init__(self) -> None:
        self.responses: dict[str, Response] = {}
        self.order: list[Response] = []
        self.speech_started: list[tuple[float, dict[str, Any]]] = []
        self.speech_stopped: list[tuple[float, dict[str, Any]]] = []
        self.transcripts: list[tuple[float, str]] = []
        self.cleared: list[tuple[float, dict[str, Any]]] = []  # output_audio_buffer.cleared (WebRTC)
        self.errors: list[dict[str, Any]] = []

    def feed(self, received: float, event: dict[str, Any]) -> Response | None:
        """Returns the response an event finished, if it did."""
        kind = event["type"]
        if kind == "input_audio_buffer.speech_started":
            self.speech_started.append((received, event))
        elif kind == "input_audio_buffer.speech_stopped":
            self.speech_stopped.append((received, event))
        elif kind == "output_audio_buffer.cleared":
            self.cleared.append((received, event))
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.transcripts.append((received, event.get("transcript", "")))
        elif kind == "response.created":
            created = Response(event["response"]["id"], received)
            self.responses[created.id] = created
            self.order.append(created)
        elif kind == "error":
            self.errors.append(event.get("error") or {})
        elif (response := self.responses.get(event.get("response_id") or "")) is not None:
            if kind in AUDIO_EVENTS:
                response.first_audio = response.first_audio or received
                response.last_audio = received
                response.audio_ms += event["audio_ms"]
                response.audio_after[received] = event["audio_ms"]
            elif kind == "output_audio_buffer.started":
                response.playout_started = received
            elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
                response.text += event.get("delta", "")
        if kind == "response.done":
            body = event["response"]
            finished = self.responses.get(body["id"])
            if finished is not None:
                finished.done = received
                finished.status = body.get("status")
                finished.reason = (body.get("status_details") or {}).get("reason")
                finished.marks = json.loads((body.get("metadata") or {}).get("gateway_latency") or "null")
                return finished
        return None


# -- voice turns ------------------------------------------------------------------------------------


async def voice_turn(session: EventStream, clip: Clip) -> dict[str, Any]:
    """Say one question; wait for the answer's response.done; measure from the end of speech."""
    assert session.mic is not None
    tracker = Tracker()
    said = session.mic.say(clip)
    record: dict[str, Any] = {"question": clip.text}
    answer: Response | None = None
    try:
        while answer is None:
            # A deadline per event, not per turn: over WebRTC the answer is over once heard, in real time.
            received, event = await session.next(time.perf_counter() + EVENT_TIMEOUT_S)
            done = tracker.feed(received, event)
            if done is None or not said.speech_end.done() or done.created < said.speech_end.result():
                continue
            if done.status == "cancelled" and done.reason == "turn_detected":
                continue  # the question was split in two turns; the answer to the rest follows
            answer = done
    except TimeoutError:
        record["error"] = f"no event for {EVENT_TIMEOUT_S:.0f} s while waiting for the answer"
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
    record.update(status=answer.status, answer=answer.text.strip(), answer_audio_s=round(answer.audio_ms / 1000, 2))
    if answer.first_audio is None:
        record["error"] = f"no answer audio (status {answer.status})"
        return record
    end = said.speech_end.result()
    record["voice_to_voice_ms"] = round((answer.first_audio - end) * 1000, 1)
    if answer.playout_started is not None:  # WebRTC: from the track sending it to the caller hearing it
        record["playout_started_to_first_audio_ms"] = round((answer.first_audio - answer.playout_started) * 1000, 1)
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


async def barge_in_run(session: EventStream, story: Clip, stop: Clip, after_s: float) -> dict[str, Any]:
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
            record["story_audio_s"] = round(story_response.audio_ms / 1000, 2)
            return record
        said = session.mic.say(stop)
        # 3. Until the story's response.done and the start of the reply to all of "Wait, stop." (the
        #    session ends with the run, so the reply need not be waited for).
        reply: Response | None = None
        while story_response.done is None or reply is None:
            try:
                received, event = await session.next(
                    min(deadline, time.perf_counter() + (8.0 if story_response.done else EVENT_TIMEOUT_S))
                )
            except TimeoutError:
                if story_response.done is None:
                    raise
                break  # no reply to the interruption (empty transcript): fine
            tracker.feed(received, event)
            if said.speech_end.done():
                reply = next((r for r in tracker.order if r.created > said.speech_end.result()), None)
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
        if story_response.done >= onset:  # else generation was over and only its playout was interrupted
            record["onset_to_response_done_ms"] = round((story_response.done - onset) * 1000, 1)
        record["audio_received_after_onset_ms"] = round(sum(after.values()), 1)
        record["story_audio_s"] = round(story_response.audio_ms / 1000, 2)
        cleared = [t for t, e in tracker.cleared if t >= onset and e.get("response_id") == story_response.id]
        if cleared:  # WebRTC: the gateway dropped the queued audio; what was in flight still arrives
            record["onset_to_output_audio_cleared_ms"] = round((cleared[0] - onset) * 1000, 1)
            if last_audio is not None:
                record["cleared_to_last_audio_ms"] = round((last_audio - cleared[0]) * 1000, 1)
        if started:
            record["vad_onset_error_ms"] = round(started_events[0][1]["audio_start_ms"] - said.onset_ms(), 1)
        # Over WebRTC a story fully generated may still be playing: clearing its audio interrupts it too.
        record["story_interrupted"] = story_response.status == "cancelled" or bool(cleared)
        if not record["story_interrupted"]:
            record["error"] = f"the story was not interrupted (status {story_response.status})"
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


async def run_worker(
    connect: Callable[[str], EventStream], index: int, work: Workload, progress: Any
) -> dict[str, Any]:
    await asyncio.sleep(index * 0.7)  # stagger concurrent sessions a little
    out: dict[str, Any] = {"turns": [], "barge_in": [], "mic_max_lag_ms": 0.0, "links": []}
    if work.turns:
        async with connect(f"s{index}") as session:
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
            if (link := await session.link_stats()) is not None:
                out["links"].append({"session": session.name, **link})
    # Each barge-in run in a session of its own: within one, the interrupted stories (over WebRTC cut
    # to what was heard) soon teach the model to answer the next request for a story in a sentence.
    measured = attempts = 0
    while measured < work.barge_in_runs and attempts < 2 * work.barge_in_runs:
        attempts += 1  # a story that ends before the interruption measures nothing: try again
        try:
            async with connect(f"b{index}.{attempts}") as session:
                await session.send(
                    {"type": "session.update", "session": {"type": "realtime", "instructions": STORY_INSTRUCTIONS}}
                )
                await session.expect("session.updated", timeout=10)
                mic = session.start_mic()
                await session.quiet(0.5)
                record = await barge_in_run(session, work.story, work.stop, work.barge_in_after_s)
                out["mic_max_lag_ms"] = max(out["mic_max_lag_ms"], round(mic.max_lag_ms, 1))
                if (link := await session.link_stats()) is not None:
                    out["links"].append({"session": session.name, **link})
        except (ConnectionError, TimeoutError, OSError) as exc:  # this attempt's session failed, not the run
            record = {"error": f"session: {exc!r}"}
        record.update(session=index, attempt=attempts)
        out["barge_in"].append(record)
        ok = bool(record.get("story_interrupted"))
        measured += ok
        progress(
            f"session {index} barge-in attempt {attempts}: speech_started {record.get('onset_to_speech_started_ms')} ms, "
            f"last audio {record.get('onset_to_last_audio_ms')} ms, done {record.get('onset_to_response_done_ms')} ms "
            f"{record.get('error', '')}",
            advance=ok,
        )
    for _ in range(work.barge_in_runs - measured):
        progress(f"session {index}: barge-in run not measured", advance=True)
    return out


def aggregate(
    results: list[dict[str, Any]], args: argparse.Namespace, health: Any, audio_in: dict[str, Any]
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
    interrupted = [b for b in runs if b.get("story_interrupted")]
    barge_in = {
        "after_first_audio_s": args.barge_in_after,
        "attempts": len(runs),
        "interrupted": len(interrupted),
        "cancelled": sum(1 for b in interrupted if b.get("story_status") == "cancelled"),
        "story_over_before_interruption": sum(
            1 for b in runs if str(b.get("error", "")).startswith("the story was over")
        ),
        "runs_split_by_vad": sum(1 for b in interrupted if b.get("speech_started_after_onset", 0) > 1),
        "runs_with_error_events": sum(1 for b in runs if b.get("errors")),
        "onset_to_speech_started_ms": summary(
            [b["onset_to_speech_started_ms"] for b in interrupted if b.get("onset_to_speech_started_ms") is not None]
        ),
        # 0 when no story audio arrived after the onset (the gateway had already sent all it made).
        "onset_to_last_audio_ms": summary(
            [max(0.0, b["onset_to_last_audio_ms"]) for b in interrupted if b.get("onset_to_last_audio_ms") is not None]
        ),
        "runs_with_audio_after_onset": sum(1 for b in interrupted if b.get("audio_received_after_onset_ms", 0) > 0),
        "onset_to_response_done_ms": summary(
            [b["onset_to_response_done_ms"] for b in interrupted if "onset_to_response_done_ms" in b]
        ),
        "audio_received_after_onset_ms": summary([b["audio_received_after_onset_ms"] for b in interrupted]),
        "vad_onset_error_ms": summary([b["vad_onset_error_ms"] for b in interrupted if "vad_onset_error_ms" in b]),
    }
    webrtc: dict[str, Any] = {}
    if args.transport == "webrtc":
        for name in ("onset_to_output_audio_cleared_ms", "cleared_to_last_audio_ms"):
            barge_in[name] = summary([b[name] for b in interrupted if name in b])
        webrtc = {
            "playout_started_to_first_audio_ms": summary(
                [t["playout_started_to_first_audio_ms"] for t in good if "playout_started_to_first_audio_ms" in t]
            ),
            "links": [link for r in results for link in r["links"]],
        }
    return {
        "benchmark": "voice",
        "transport": args.transport,
        "url": args.url,
        "sessions": args.sessions,
        "gateway": health,
        "input": audio_in,
        "voice_to_voice_ms": summary([t["voice_to_voice_ms"] for t in good]),
        "stages_ms": stages,
        "stage_share_of_voice_to_voice_pct_median": shares,
        "vad_end_error_ms": summary([t["vad_end_error_ms"] for t in turns if "vad_end_error_ms" in t]),
        "turns_ok": len(good),
        "turns_total": len(turns),
        "turns_split_by_vad": sum(1 for t in turns if t.get("speech_started_events", 1) > 1),
        "turns_preempted": sum(1 for t in staged if t.get("preempted")),
        "generation_head_start_ms": summary([t["generation_head_start_ms"] for t in staged if t.get("preempted")]),
        "barge_in": barge_in,
        "mic_max_lag_ms": max((r["mic_max_lag_ms"] for r in results), default=0.0),
        "end_send_lag_ms": summary([t["end_send_lag_ms"] for t in turns if "end_send_lag_ms" in t]),
        **webrtc,
        "errors": [x for x in turns + runs if "error" in x],
        "turns": turns,
        "barge_in_runs": runs,
    }


def connector(args: argparse.Namespace, wall_offset: float) -> tuple[Callable[[str], EventStream], int]:
    """How a session of the chosen transport is opened, and its microphone's sample rate."""
    if args.transport == "webrtc":
        from benchmarks.voice_rtc import RATE, WebRtcSession
        from gateway.api.transports.webrtc import offer_host_addresses

        # aioice never offers 127.0.0.1 by itself: on a loopback-only host the call could not connect.
        offer_host_addresses([args.ice_host])
        return (lambda name: WebRtcSession(args.url, name, wall_offset)), RATE
    return (lambda name: WebSocketSession(args.url, name, wall_offset)), WS_RATE


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
        wall_offset = time.time() - time.perf_counter()
        connect, rate = connector(args, wall_offset)
        speaker = Speaker()
        clips = {text: speaker.say(text, rate) for text in [*QUESTIONS, WARMUP, STORY, STOP]}
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
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar:
            task = bar.add_task("voice turns and barge-ins", total=total)

            def progress(message: str, advance: bool = True) -> None:
                bar.console.print(message)
                if advance:
                    bar.advance(task)

            results = await asyncio.gather(*(run_worker(connect, i, work, progress) for i in range(args.sessions)))
        audio_in = {
            "format": "pcm16" if args.transport == "websocket" else "opus (aiortc track)",
            "rate": rate,
            "chunk_ms": 20,
            "paced": "wall clock",
            "speech": {c.text: {"speech_s": round(c.speech_s, 2)} for c in clips.values()},
        }
        return aggregate(list(results), args, health, audio_in)
    finally:
        if gateway is not None:
            gateway.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.voice", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway (http://host:port); default: start one on a free port")
    parser.add_argument(
        "--transport",
        choices=("websocket", "webrtc"),
        default="websocket",
        help="the Realtime WebSocket (default) or a WebRTC call made with aiortc",
    )
    parser.add_argument(
        "--ice-host",
        default="127.0.0.1",
        help="WebRTC: the address this caller offers as its ICE candidate (127.0.0.1)",
    )
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
    return 0 if report["turns_ok"] or report["barge_in"]["interrupted"] else 1


if __name__ == "__main__":
    sys.exit(main())
