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
from dataclasses import dataclass
from typing import Any

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
    """When a spoken clip left the microphone (perf_counter)."""

    onset: float | None = None  # the first chunk with speech in it
    end: float | None = None  # the chunk with the clip's last sample


class Microphone:
    """What the microphone sends next, one chunk at a time: speech queued by say(), each clip followed by
    `tail_s` of silence. The caller paces it and says when each chunk leaves; no I/O here."""

    def __init__(self, rate: int, tail_s: float) -> None:
        self.rate = rate
        self.chunk = rate * CHUNK_MS // 1000
        self._tail = np.zeros(int(rate * tail_s), np.int16)
        self._queue: list[tuple[np.ndarray, Utterance | None]] = []  # clips (with their timing) and silences

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def say(self, pcm: np.ndarray) -> Utterance:
        """Speak after any speech still queued; queued silence gives way, so an interruption starts now."""
        utterance = Utterance()
        self._queue = [piece for piece in self._queue if piece[1] is not None]
        self._queue.append((pcm, utterance))
        if self._tail.size:
            self._queue.append((self._tail, None))
        return utterance

    def clear(self) -> None:
        self._queue.clear()

    def take(self, at: float) -> np.ndarray | None:
        """The next chunk (padded with silence), leaving at `at`; None when nothing is queued."""
        if not self._queue:
            return None
        chunk = np.zeros(self.chunk, np.int16)
        filled = 0
        while filled < self.chunk and self._queue:
            pcm, utterance = self._queue[0]
            piece = pcm[: self.chunk - filled]
            if utterance is not None:
                if utterance.onset is None and piece.size and int(np.abs(piece.astype(np.int32)).max()) >= ONSET_LEVEL:
                    utterance.onset = at
                if piece.size == pcm.size:
                    utterance.end = at
            if piece.size == pcm.size:
                self._queue.pop(0)
            else:
                self._queue[0] = (pcm[piece.size :], utterance)
            chunk[filled : filled + piece.size] = piece
            filled += piece.size
        return chunk


@dataclass(frozen=True)
class AudioIn:
    """Answer audio received: a response.output_audio.delta, or a loud frame of a WebRTC call's track."""

    seconds: float
    response_id: str | None  # None over WebRTC: the track does not say (the latest response created owns it)


Received = tuple[float, dict[str, Any] | AudioIn]  # (perf_counter at arrival, what arrived)


@dataclass
class Heard:
    """One response as the client got it."""

    first_audio: float | None = None
    last_audio: float | None = None
    audio_s: float = 0.0
    done: float | None = None
    status: str | None = None
    marks: dict[str, Any] | None = None
    played: bool = False  # output_audio_buffer.stopped or .cleared: the server's track is done with it
    cleared: bool = False  # ... by .cleared: an interruption stopped it


class SpokenTurn:
    """One spoken turn's bookkeeping, fed what arrives; the client drives it (SpokenClient.turn). No I/O.

    The answer is the first response created in the turn. With barge-in, the interruption is due
    `barge_in_after_s` after the answer's first audio, unless the answer is over by then, and the reply
    is the first response created after it. The turn ends when the answer is over (with an interruption:
    the reply); over WebRTC a response is over when its playout is, since it plays at real-time pace.
    """

    def __init__(self, record: TurnRecord, question: Utterance, *, plays_out: bool,
                 barge_in_after_s: float | None) -> None:
        self.record = record
        self.question = question
        self.plays_out = plays_out
        self.barge_in_after_s = barge_in_after_s
        self.timer = DeltaTimer()
        self.responses: dict[str | None, Heard] = {}
        self.answer: Heard | None = None
        self.reply: Heard | None = None
        self.current: Heard | None = None  # the latest response created
        self.interrupt_at: float | None = None
        self.interruption: Utterance | None = None

    def feed(self, at: float, item: dict[str, Any] | AudioIn) -> None:
        if isinstance(item, AudioIn):
            heard = self.responses.get(item.response_id) if item.response_id is not None else self.current
            if heard is None:
                return
            if heard.first_audio is None:
                heard.first_audio = at
                if heard is self.answer and self.barge_in_after_s is not None:
                    self.interrupt_at = at + self.barge_in_after_s
            heard.last_audio = at
            heard.audio_s += item.seconds
            return
        kind = item.get("type")
        response = item.get("response") or {}
        heard = self.responses.get(item.get("response_id") or response.get("id"))
        if kind == "response.created":
            heard = self.responses[response.get("id")] = Heard()
            self.current = heard
            if self.answer is None:
                self.answer = heard
            elif self.interruption is not None and self.reply is None:
                self.reply = heard
        elif kind == "response.output_audio_transcript.delta" and heard is not None and heard is self.answer:
            self.timer.tick(self.record, at)
        elif kind == "error":
            self.record.error = str((item.get("error") or {}).get("code") or "error")
        elif kind == "response.done" and heard is not None:
            heard.done, heard.status, heard.marks = at, response.get("status"), parse_marks(response)
            if heard is self.answer and heard.status == "failed" and self.record.error is None:
                self.record.error = str(((response.get("status_details") or {}).get("error") or {}).get("code")
                                        or "failed")
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared") and heard is not None:
            heard.played = True
            heard.cleared = kind == "output_audio_buffer.cleared"

    def interrupt_due(self, now: float) -> bool:
        return self.interrupt_at is not None and now >= self.interrupt_at

    def interrupted(self, utterance: Utterance) -> None:
        self.interruption = utterance
        self.interrupt_at = None

    def over(self, heard: Heard | None, now: float) -> bool:
        if heard is None or heard.done is None:
            return False
        if not self.plays_out or heard.played:
            return True
        return now - max(heard.done, heard.last_audio or heard.done) >= QUIET_S

    def finished(self, now: float) -> bool:
        if self.interruption is None:
            return self.over(self.answer, now)  # with barge-in: the answer ended before it was interrupted
        return self.over(self.reply, now)

    def wake_at(self, now: float, deadline: float) -> float:
        wake = min(deadline, self.interrupt_at if self.interrupt_at is not None else deadline)
        return min(wake, now + POLL_S) if self.plays_out else wake

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

    def __init__(self, target: Target, mic: Microphone, barge_in_after_s: float | None) -> None:
        self.target = target
        self.mic = mic
        self.barge_in_after_s = barge_in_after_s
        self._inbox: asyncio.Queue[Received | BenchError | ValueError] = asyncio.Queue()

    def say(self, pcm: np.ndarray) -> Utterance:
        return self.mic.say(pcm)

    async def turn(self, record: TurnRecord, question: np.ndarray, interrupter: np.ndarray | None,
                   timeout_s: float = 120) -> None:
        """`interrupter`: with --barge-in, what to say over the answer."""
        spoken = SpokenTurn(record, self.say(question), plays_out=self.plays_out,
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

    @abstractmethod
    async def close(self) -> None: ...


class RealtimeVoiceClient(SpokenClient):
    """A Realtime session over a WebSocket, spoken turns: 24 kHz audio/pcm appended at real-time pace, server
    VAD creating the response; the answer's audio arrives as deltas, faster than real time on most servers."""

    plays_out = False

    def __init__(self, socket: RealtimeTextClient, barge_in_after_s: float | None) -> None:
        super().__init__(socket.target, Microphone(VOICE_RATE, TAIL_SILENCE_S), barge_in_after_s)
        self.socket = socket
        self._speaking = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._send_audio())]

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, barge_in_after_s: float | None,
                   timeout_s: float = 30) -> RealtimeVoiceClient:
        socket = await RealtimeTextClient.open(target, system_prompt, timeout_s, spoken=True)
        return cls(socket, barge_in_after_s)

    def say(self, pcm: np.ndarray) -> Utterance:
        utterance = super().say(pcm)
        self._speaking.set()
        return utterance

    async def _send_audio(self) -> None:
        """Chunks leave when complete, as a microphone's would, while there is something to say."""
        while True:
            await self._speaking.wait()
            self._speaking.clear()
            started, sent = time.perf_counter(), 0
            while self.mic.pending:
                sent += 1
                await asyncio.sleep(max(0.0, started + sent * CHUNK_MS / 1000 - time.perf_counter()))
                chunk = self.mic.take(time.perf_counter())
                if chunk is None:
                    break
                try:
                    await self.socket.send({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(chunk.tobytes()).decode()})
                except websockets.ConnectionClosed:
                    return  # the reader reports it

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
