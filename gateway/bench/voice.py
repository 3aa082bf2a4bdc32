"""Spoken turns, over the Realtime WebSocket (here) or a WebRTC call (webrtc.py), timed from the client's side.

A session has one microphone, paced by the wall clock in 20 ms chunks. A turn speaks its question; the
server's VAD ends it and answers. With --barge-in, the next question is spoken over the answer, and
barge_in_ms is how long after the onset of that speech the answer stopped (SpokenTurn.measure says when
an answer stops on each transport).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
import websockets

from gateway.bench.clients import BenchError, DeltaTimer, RealtimeTextClient, Target, elapsed_ms
from gateway.bench.stages import VOICE_CHAIN, ClockOffset, parse_marks, turn_stages
from gateway.bench.stats import TurnRecord

VOICE_RATE = 24000  # audio/pcm, the Realtime API's default format
CHUNK_MS = 20
TAIL_SILENCE_S = 1.5  # after each question over the WebSocket: the server's VAD ends the turn in it
ONSET_LEVEL = 500  # int16 peak of a chunk that holds speech (the onset of an interruption)
# Over WebRTC, a response whose playout the server never reports over (no output_audio_buffer.stopped, as for
# a reply without audio) is over once no audio of it arrived for this long after its response.done.
QUIET_S = 1.0
POLL_S = 0.05  # how often a turn waiting for a playout to end looks again


@dataclass
class Utterance:
    """When a spoken clip left the microphone (perf_counter), and where its speech stands in the audio sent."""

    onset: float | None = None  # the chunk with the first speech in it
    end: float | None = None  # the chunk with the clip's last sample
    speech_end: float | None = None  # when the last speech sample was spoken: placed within its chunk
    end_lag_ms: float = 0.0  # how late the pacer had the chunk with the speech's end ready (this process's lag)
    # Milliseconds into the audio sent since the microphone started: what a server's VAD events count.
    stream_onset_ms: float | None = None
    stream_speech_end_ms: float | None = None


class Microphone:
    """What the microphone sends next, one chunk at a time: speech queued by say(), each clip followed by
    `tail_s` of silence; an `always_on` microphone sends silence when nothing is queued, as a real one does.
    take() says what leaves at a given time (no I/O); next_chunk() paces the chunks on the wall clock."""

    def __init__(self, rate: int, tail_s: float, always_on: bool = False) -> None:
        self.rate = rate
        self.chunk = rate * CHUNK_MS // 1000
        self.always_on = always_on
        self.samples = 0  # samples taken since the microphone started
        self.max_lag_ms = 0.0  # the most the pacer was late with a chunk
        self._tail = np.zeros(int(rate * tail_s), np.int16)
        self._queue: list[_Queued] = []  # clips (with their timing) and silences
        self._clock: tuple[float, int] | None = None  # the pacer's start: (perf_counter, samples)

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def say(self, pcm: np.ndarray, speech: tuple[int, int] | None = None) -> Utterance:
        """Speak after any speech still queued; queued silence gives way, so an interruption starts now.
        `speech`: the clip's first and last + 1 speech samples (default: the first sample at ONSET_LEVEL, and
        the clip's end)."""
        if speech is None:
            loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) >= ONSET_LEVEL)
            speech = (int(loud[0]) if loud.size else -1, pcm.size)
        utterance = Utterance()
        self._queue = [piece for piece in self._queue if piece.utterance is not None]
        self._queue.append(_Queued(pcm, utterance, speech))
        if self._tail.size:
            self._queue.append(_Queued(self._tail))
        return utterance

    def clear(self) -> None:
        self._queue.clear()

    def take(self, at: float, lag_ms: float = 0.0) -> np.ndarray | None:
        """The next chunk (padded with silence), leaving at `at` (`lag_ms` late); None when nothing is queued
        (silence when always on)."""
        if not self._queue and not self.always_on:
            return None
        chunk = np.zeros(self.chunk, np.int16)
        filled = 0
        while filled < self.chunk and self._queue:
            queued = self._queue[0]
            piece = queued.pcm[queued.sent : queued.sent + self.chunk - filled]
            if (utterance := queued.utterance) is not None:
                self._mark(utterance, queued, piece.size, at, filled, lag_ms)
            queued.sent += piece.size
            if queued.sent == queued.pcm.size:
                self._queue.pop(0)
            chunk[filled : filled + piece.size] = piece
            filled += piece.size
        self.samples += self.chunk
        return chunk

    def _mark(self, utterance: Utterance, queued: _Queued, size: int, at: float, filled: int, lag_ms: float) -> None:
        """Times what of `utterance` leaves in this chunk: `size` samples from `queued.sent`, at `filled`."""
        first, last = queued.speech
        begin = self.samples + filled - queued.sent  # where the clip's first sample stands in the stream
        if utterance.onset is None and queued.sent <= first < queued.sent + size:
            utterance.onset = at
            utterance.stream_onset_ms = 1000 * (begin + first) / self.rate
        if queued.sent < last <= queued.sent + size:
            utterance.speech_end = at - (self.chunk - (filled + last - queued.sent)) / self.rate
            utterance.stream_speech_end_ms = 1000 * (begin + last) / self.rate
            utterance.end_lag_ms = round(lag_ms, 1)
        if queued.sent + size == queued.pcm.size:
            utterance.end = at

    async def next_chunk(self) -> np.ndarray | None:
        """The next chunk once it is complete by the wall clock, as a microphone hands it over; None, and the
        clock starts again with the next clip, when there is nothing to send."""
        if not self._queue and not self.always_on:
            self._clock = None
            return None
        if self._clock is None:
            self._clock = (time.perf_counter(), self.samples)
        started, base = self._clock
        due = started + (self.samples - base + self.chunk) / self.rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        ready = time.perf_counter()
        lag_ms = (ready - due) * 1000
        self.max_lag_ms = max(self.max_lag_ms, lag_ms)
        return self.take(ready, lag_ms)


@dataclass
class _Queued:
    pcm: np.ndarray
    utterance: Utterance | None = None  # None: silence between clips
    speech: tuple[int, int] = (-1, 0)
    sent: int = 0  # samples of it already taken


@dataclass(frozen=True)
class AudioIn:
    """Answer audio received: a response.output_audio.delta, or a loud frame of a WebRTC call's track."""

    seconds: float
    response_id: str | None  # None over WebRTC: the track does not say (the latest response created owns it)


Received = tuple[float, dict[str, Any] | AudioIn]  # (perf_counter at arrival, what arrived)


@dataclass
class Heard:
    """One response as the client got it."""

    id: str | None = None
    created: float | None = None
    playout_started: float | None = None  # output_audio_buffer.started (WebRTC: the server's track took it)
    first_audio: float | None = None
    last_audio: float | None = None
    audio_s: float = 0.0
    audio_at: dict[float, float] = field(default_factory=dict)  # arrival -> seconds of audio (what came when)
    text: str = ""  # its text or transcript deltas
    done: float | None = None
    status: str | None = None
    reason: str | None = None  # status_details.reason
    marks: dict[str, Any] | None = None
    played: bool = False  # output_audio_buffer.stopped or .cleared: the server's track is done with it
    cleared: bool = False  # ... by .cleared: an interruption stopped it


Timed = tuple[float, dict[str, Any]]


class SessionLog:
    """What a Realtime session's events said, folded as they arrive: its responses, in order of creation, and
    the input audio's marks. No I/O."""

    def __init__(self) -> None:
        self.responses: dict[str | None, Heard] = {}
        self.order: list[Heard] = []
        self.current: Heard | None = None  # the latest response created
        self.speech_started: list[Timed] = []
        self.speech_stopped: list[Timed] = []
        self.transcripts: list[tuple[float, str]] = []  # final transcripts of the input audio
        self.cleared: list[Timed] = []  # output_audio_buffer.cleared (WebRTC)
        self.errors: list[dict[str, Any]] = []  # the error events' error objects

    def feed(self, at: float, item: dict[str, Any] | AudioIn) -> Heard | None:
        """The response `item` is about, if any. Audio without a response id is the latest response's."""
        if isinstance(item, AudioIn):
            heard = self.responses.get(item.response_id) if item.response_id is not None else self.current
            if heard is not None:
                heard.first_audio = heard.first_audio if heard.first_audio is not None else at
                heard.last_audio = at
                heard.audio_s += item.seconds
                heard.audio_at[at] = item.seconds
            return heard
        kind = item.get("type")
        response = item.get("response") or {}
        if kind == "response.created":
            heard = self.current = self.responses[response.get("id")] = Heard(response.get("id"), created=at)
            self.order.append(heard)
            return heard
        if kind == "error":
            self.errors.append(item.get("error") or {})
        elif kind == "input_audio_buffer.speech_started":
            self.speech_started.append((at, item))
        elif kind == "input_audio_buffer.speech_stopped":
            self.speech_stopped.append((at, item))
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.transcripts.append((at, str(item.get("transcript") or "")))
        elif kind == "output_audio_buffer.cleared":
            self.cleared.append((at, item))
        heard = self.responses.get(item.get("response_id") or response.get("id"))
        if heard is None:
            return None
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            heard.text += str(item.get("delta") or "")
        elif kind == "output_audio_buffer.started":
            heard.playout_started = at
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            heard.played = True
            heard.cleared = kind == "output_audio_buffer.cleared"
        elif kind == "response.done":
            heard.done, heard.status, heard.marks = at, response.get("status"), parse_marks(response)
            heard.reason = (response.get("status_details") or {}).get("reason")
        return heard


def playback(audio_at: dict[float, float]) -> tuple[float, float | None]:
    """A listener who plays an answer from its first audio on, chunk after chunk as they arrive (arrival -> seconds
    of audio): the seconds of silence within it (each chunk that came after the audio before it had played out),
    and when the last chunk has played (None without audio)."""
    stalled = 0.0
    plays_until: float | None = None
    for at, seconds in sorted(audio_at.items()):
        if plays_until is not None and at > plays_until:
            stalled += at - plays_until
        plays_until = max(plays_until if plays_until is not None else at, at) + seconds
    return stalled, plays_until


def playback_stall_ms(audio_at: dict[float, float]) -> float:
    """The silence within an answer for its listener (see playback). A server that sends its audio just in time,
    not all at once, must keep this at 0."""
    return round(1000.0 * playback(audio_at)[0], 1)


class SpokenTurn:
    """One spoken turn's bookkeeping, fed what arrives; the client drives it (SpokenClient.turn). No I/O.

    The answer is the first response created in the turn. With barge-in, the interruption is due
    `barge_in_after_s` after the answer's first audio, unless the answer is over by then, and the reply
    is the first response created after it. The turn ends when the answer is over (with an interruption:
    the reply); over WebRTC a response is over when its playout is, since it plays at real-time pace.
    """

    def __init__(self, record: TurnRecord, question: Utterance, *, plays_out: bool,
                 barge_in_after_s: float | None, listens: bool = False) -> None:
        self.record = record
        self.question = question
        self.plays_out = plays_out
        self.listens = listens  # a response that sent audio is over once its listener has heard it (see over)
        self.barge_in_after_s = barge_in_after_s
        self.timer = DeltaTimer()
        self.log = SessionLog()
        self.answer: Heard | None = None
        self.reply: Heard | None = None
        self.interrupt_at: float | None = None
        self.interruption: Utterance | None = None

    def feed(self, at: float, item: dict[str, Any] | AudioIn) -> None:
        heard = self.log.feed(at, item)
        if isinstance(item, AudioIn):
            if (heard is not None and heard is self.answer and heard.first_audio == at
                    and self.barge_in_after_s is not None and self.interrupt_at is None and self.interruption is None):
                self.interrupt_at = at + self.barge_in_after_s
            return
        kind = item.get("type")
        if kind == "response.created":
            if self.answer is None:
                self.answer = heard
            elif self.interruption is not None and self.reply is None:
                self.reply = heard
        elif kind == "response.output_audio_transcript.delta" and heard is not None and heard is self.answer:
            self.timer.tick(self.record, at)
        elif kind == "error":
            self.record.error = str((item.get("error") or {}).get("code") or "error")
        elif kind == "response.done" and heard is not None and heard is self.answer:
            if heard.status == "failed" and self.record.error is None:
                response = item.get("response") or {}
                self.record.error = str(((response.get("status_details") or {}).get("error") or {}).get("code")
                                        or "failed")

    def interrupt_due(self, now: float) -> bool:
        return self.interrupt_at is not None and now >= self.interrupt_at

    def interrupted(self, utterance: Utterance) -> None:
        self.interruption = utterance
        self.interrupt_at = None

    def over(self, heard: Heard | None, now: float) -> bool:
        if heard is None or heard.done is None:
            return False
        if self.plays_out:
            return heard.played or now - max(heard.done, heard.last_audio or heard.done) >= QUIET_S
        if self.listens:  # its audio came faster than it plays: the turn ends when it would have played out
            _, plays_until = playback(heard.audio_at)
            return plays_until is None or now >= plays_until
        return True

    def finished(self, now: float) -> bool:
        if self.interruption is None:
            return self.over(self.answer, now)  # with barge-in: the answer ended before it was interrupted
        return self.over(self.reply, now)

    def wake_at(self, now: float, deadline: float) -> float:
        wake = min(deadline, self.interrupt_at if self.interrupt_at is not None else deadline)
        return min(wake, now + POLL_S) if self.plays_out or self.listens else wake

    def measure(self, clock: ClockOffset | None) -> None:
        """Fill the record: the answer's timings from the end of the question's speech, and the barge-in."""
        record, answer = self.record, self.answer
        end = self.question.end
        if answer is None or end is None:
            return
        if self.timer.first is not None:
            record.ttft_ms = elapsed_ms(end, self.timer.first)
        if answer.first_audio is not None:
            record.first_audio_ms = record.voice_to_voice_ms = elapsed_ms(end, answer.first_audio)
            if not self.plays_out and answer.last_audio is not None and answer.audio_s > 0:
                record.audio_rtf = round((answer.last_audio - answer.first_audio) / answer.audio_s, 3)
                record.audio_stall_ms = playback_stall_ms(answer.audio_at)
        if answer.done is not None:
            record.total_ms = elapsed_ms(end, answer.done)
        record.stages = turn_stages(answer.marks, VOICE_CHAIN, start=end, end=answer.first_audio, clock=clock)
        if self.barge_in_after_s is None:
            return
        onset = self.interruption.onset if self.interruption is not None else None
        stopped = answer.status == "cancelled" or answer.cleared
        # Over WebRTC the caller hears the server's track: the answer stops with its last loud frame. Over the
        # WebSocket its deltas run ahead of playback in bursts (a clause at a time), so the last one often
        # came before the onset though more were to come: the answer stops when the server ends it.
        stop = (answer.last_audio if self.plays_out else answer.done) if stopped else None
        if onset is not None and stop is not None and stop >= onset:
            record.barge_in_ms = elapsed_ms(onset, stop)
        else:  # over before the interruption, or not stopped by it
            record.barge_in_missed = True


class SpokenClient(ABC):
    """Spoken turns over a transport that fills `_inbox` with what arrives, a BenchError when it closes, or a
    ValueError when the server sent what is not the protocol (the turn fails with bad_response)."""

    plays_out: bool  # the answer's audio plays at real-time pace after its response.done (WebRTC)
    listens = False  # a turn lasts until its answer's audio would have played (--listen, WebSocket)

    def __init__(self, target: Target, mic: Microphone, barge_in_after_s: float | None) -> None:
        self.target = target
        self.mic = mic
        self.barge_in_after_s = barge_in_after_s
        self._inbox: asyncio.Queue[Received | BenchError | ValueError] = asyncio.Queue()

    def say(self, pcm: np.ndarray, speech: tuple[int, int] | None = None) -> Utterance:
        return self.mic.say(pcm, speech)

    async def turn(self, record: TurnRecord, question: np.ndarray, interrupter: np.ndarray | None,
                   timeout_s: float = 120) -> None:
        """`interrupter`: with --barge-in, what to say over the answer."""
        spoken = SpokenTurn(record, self.say(question), plays_out=self.plays_out, listens=self.listens,
                            barge_in_after_s=self.barge_in_after_s if interrupter is not None else None)
        deadline = time.perf_counter() + timeout_s
        try:
            while not spoken.finished(now := time.perf_counter()):
                if interrupter is not None and spoken.interrupt_due(now):
                    spoken.interrupted(self.say(interrupter))
                    continue
                if now >= deadline:
                    raise TimeoutError
                received = await self._receive(spoken.wake_at(now, deadline) - now)
                if received is not None:
                    spoken.feed(*received)
        except BaseException:
            self.mic.clear()  # a failed or cancelled turn stops speaking at once
            raise
        spoken.measure(self.target.clock)

    async def _receive(self, timeout_s: float) -> Received | None:
        """What arrived next, or None after `timeout_s`."""
        if self._inbox.empty():
            try:
                async with asyncio.timeout(max(0.0, timeout_s)):
                    received = await self._inbox.get()
            except TimeoutError:
                return None
        else:
            received = self._inbox.get_nowait()
        if isinstance(received, BenchError | ValueError):
            raise received
        return received

    async def next(self, deadline: float) -> Received:
        """What arrived next; TimeoutError at `deadline` (perf_counter)."""
        received = await self._receive(deadline - time.perf_counter())
        if received is None:
            raise TimeoutError
        return received

    async def expect(self, kind: str, timeout_s: float) -> Timed:
        """The next event of type `kind`, what came before it passed over."""
        deadline = time.perf_counter() + timeout_s
        while True:
            at, item = await self.next(deadline)
            if isinstance(item, dict) and item.get("type") == kind:
                return at, item

    async def quiet(self, seconds: float) -> None:
        """Pass over what arrives until nothing did for `seconds` (the previous turn is over)."""
        while await self._receive(seconds) is not None:
            pass

    async def link_stats(self) -> dict[str, Any] | None:
        """What the transport can tell about its own delays, if anything."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abstractmethod
    async def send(self, event: dict[str, Any]) -> None:
        """A client event."""

    @abstractmethod
    async def close(self) -> None: ...


class RealtimeVoiceClient(SpokenClient):
    """A Realtime session over a WebSocket, spoken turns: 24 kHz audio/pcm appended at real-time pace, server
    VAD creating the response; the answer's audio arrives as deltas, faster than real time on most servers."""

    plays_out = False

    def __init__(self, socket: RealtimeTextClient, barge_in_after_s: float | None, always_on: bool = False,
                 listens: bool = False) -> None:
        mic = Microphone(VOICE_RATE, 0, always_on=True) if always_on else Microphone(VOICE_RATE, TAIL_SILENCE_S)
        super().__init__(socket.target, mic, barge_in_after_s)
        self.socket = socket
        self.listens = listens
        self._speaking = asyncio.Event()
        if always_on:
            self._speaking.set()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._send_audio())]

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, barge_in_after_s: float | None,
                   timeout_s: float = 30, *, configure: bool = True, always_on: bool = False,
                   listens: bool = False) -> RealtimeVoiceClient:
        """`configure`: False keeps the server's session defaults. `always_on`: the microphone sends silence
        between clips, as a real one does (the server's input audio clock then runs with the wall clock).
        `listens`: each turn lasts until its answer would have played out (--listen)."""
        socket = await RealtimeTextClient.open(target, system_prompt, timeout_s, spoken=True, configure=configure)
        return cls(socket, barge_in_after_s, always_on, listens)

    def say(self, pcm: np.ndarray, speech: tuple[int, int] | None = None) -> Utterance:
        utterance = super().say(pcm, speech)
        self._speaking.set()
        return utterance

    async def _send_audio(self) -> None:
        """Chunks leave when complete, as a microphone's would, while there is something to say."""
        while True:
            await self._speaking.wait()
            self._speaking.clear()
            while (chunk := await self.mic.next_chunk()) is not None:
                try:
                    await self.socket.send({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(chunk.tobytes()).decode()})
                except websockets.ConnectionClosed:
                    return  # the reader reports it

    async def send(self, event: dict[str, Any]) -> None:
        await self.socket.send(event)

    async def _read(self) -> None:
        connection = self.socket.connection
        try:
            async for raw in connection:
                event = json.loads(raw)
                if not isinstance(event, dict):
                    self._inbox.put_nowait(ValueError("an event was not a JSON object"))
                    return
                if event.get("type") == "response.output_audio.delta":
                    seconds = len(base64.b64decode(event.get("delta") or "")) / 2 / VOICE_RATE
                    self._inbox.put_nowait((time.perf_counter(), AudioIn(seconds, event.get("response_id"))))
                else:
                    self._inbox.put_nowait((time.perf_counter(), event))
        except websockets.ConnectionClosed:
            pass
        except ValueError:
            self._inbox.put_nowait(ValueError("an event was not JSON"))
            return
        code = connection.close_code if connection.close_code is not None else "no close frame"
        self._inbox.put_nowait(BenchError(f"the server closed the session ({code})"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.socket.close()
