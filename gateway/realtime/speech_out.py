"""Where a response's speech goes: `response.output_audio.delta` events (WebSocket) or the WebRTC playout."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

from gateway.platform.latency import TurnMarks
from gateway.realtime.inputs import AudioDelta
from gateway.realtime.response_events import ResponseEvents
from media.codecs import encode_output
from media.frames import AudioChunk
from media.resample import Resampler

if TYPE_CHECKING:
    from gateway.realtime.session import RealtimeSession

# Deltas of at most this much audio: small enough to start playing early, big enough to be cheap.
DELTA_MS = 200


class WebSocketSpeech:
    """Resamples Piper's output to the session's format and sends it as base64 deltas."""

    def __init__(self, session: RealtimeSession, events: ResponseEvents, marks: TurnMarks, tts_rate: int) -> None:
        self.session = session
        self.events = events
        self.marks = marks
        output_format = session.config.audio.output.format
        self.format = output_format.type
        self.rate = output_format.sample_rate
        self.resampler = Resampler(tts_rate, self.rate) if tts_rate != self.rate else None

    @classmethod
    def create(cls, session: RealtimeSession, events: ResponseEvents, marks: TurnMarks) -> WebSocketSpeech:
        assert session.runtime.tts is not None
        return cls(session, events, marks, session.runtime.tts.sample_rate)

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
            self.session.feed(AudioDelta(self.events.response_id, payload))  # the first starts the echo guard
        if len(pcm):
            self.marks.mark("last_audio", latest=True)


class PlayoutSpeech:
    """Resamples Piper's output to 48 kHz into the WebRTC playout buffer; the track paces it out."""

    def __init__(self, session: RealtimeSession, events: ResponseEvents, marks: TurnMarks, tts_rate: int) -> None:
        assert session.playout is not None
        self.playout = session.playout
        self.item_id = events.item.id
        self.marks = marks
        self.resampler = Resampler(tts_rate, self.playout.sample_rate)

    @classmethod
    def create(cls, session: RealtimeSession, events: ResponseEvents, marks: TurnMarks) -> PlayoutSpeech:
        assert session.runtime.tts is not None
        return cls(session, events, marks, session.runtime.tts.sample_rate)

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
