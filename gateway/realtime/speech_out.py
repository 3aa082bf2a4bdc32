"""Where a response's speech goes: `response.output_audio.delta` events (WebSocket) or the WebRTC playout."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gateway.platform.latency import TurnMarks
from gateway.protocol.session_config import AudioFormat
from gateway.realtime.inputs import AudioDelta, Input
from gateway.realtime.response_events import ResponseEvents
from media.codecs import encode_output
from media.frames import AudioChunk
from media.playout import PlayoutBuffer
from media.resample import Resampler

# Deltas of at most this much audio: small enough to start playing early, big enough to be cheap.
DELTA_MS = 200


class SpeechStream(Protocol):
    """Where one response's audio goes: WebSocket deltas, or the WebRTC playout buffer."""

    def write(self, pcm: np.ndarray) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SpeechTarget:
    """What a response's audio stream needs of its session: the core's `feed` (audio deltas are its inputs), the
    output format, the playout buffer (WebRTC) and the rate Piper speaks at."""

    feed: Callable[[Input], None]
    output_format: AudioFormat
    playout: PlayoutBuffer | None
    tts_rate: int


# A transport's kind of stream (WebSocketSpeech.create, PlayoutSpeech.create).
SpeechFactory = Callable[[SpeechTarget, ResponseEvents, TurnMarks], SpeechStream]


class WebSocketSpeech:
    """Resamples Piper's output to the session's format and sends it as base64 deltas."""

    def __init__(self, target: SpeechTarget, events: ResponseEvents, marks: TurnMarks) -> None:
        self.feed = target.feed
        self.events = events
        self.marks = marks
        self.format = target.output_format.type
        self.rate = target.output_format.sample_rate
        self.resampler = Resampler(target.tts_rate, self.rate) if target.tts_rate != self.rate else None

    @classmethod
    def create(cls, target: SpeechTarget, events: ResponseEvents, marks: TurnMarks) -> WebSocketSpeech:
        return cls(target, events, marks)

    def write(self, pcm: np.ndarray) -> None:
        self._send(self.resampler.process(pcm) if self.resampler else pcm)

    def close(self) -> None:
        if self.resampler is not None:
            self._send(self.resampler.flush())

    def _send(self, pcm: np.ndarray) -> None:
        step = self.rate * DELTA_MS // 1000
        for start in range(0, len(pcm), step):
            piece = AudioChunk(np.ascontiguousarray(pcm[start : start + step], dtype=np.int16), self.rate)
            payload = base64.b64encode(encode_output(self.format, piece)).decode("ascii")
            self.marks.mark("first_audio")
            self.feed(AudioDelta(self.events.response_id, payload))  # the first starts the echo guard
        if len(pcm):
            self.marks.mark("last_audio", latest=True)


class PlayoutSpeech:
    """Resamples Piper's output to 48 kHz into the WebRTC playout buffer; the track paces it out."""

    def __init__(self, target: SpeechTarget, events: ResponseEvents, marks: TurnMarks) -> None:
        assert target.playout is not None, "a WebRTC session has its playout before it starts"
        self.playout = target.playout
        self.item_id = events.item.id
        self.marks = marks
        self.resampler = Resampler(target.tts_rate, self.playout.sample_rate)

    @classmethod
    def create(cls, target: SpeechTarget, events: ResponseEvents, marks: TurnMarks) -> PlayoutSpeech:
        return cls(target, events, marks)

    def write(self, pcm: np.ndarray) -> None:
        self._queue(self.resampler.process(pcm))

    def close(self) -> None:
        self._queue(self.resampler.flush())

    def _queue(self, pcm: np.ndarray) -> None:
        if len(pcm):
            # The track sends queued audio within one 20 ms frame: this is when it leaves us.
            self.marks.mark("first_audio")
            self.marks.mark("last_audio", latest=True)
            self.playout.write(self.item_id, pcm)
