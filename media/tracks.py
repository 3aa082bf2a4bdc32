"""The only aiortc media code: a paced outbound track fed by a PlayoutBuffer, and an inbound reader.

aiortc's sender pulls recv() in its own task and stops a track for good the first time recv()
raises, so the outbound track plays silence between replies and never raises.
"""

from __future__ import annotations

import asyncio
import fractions
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

import numpy as np
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from media.frames import AudioChunk, float_to_int16
from media.playout import PlayoutBuffer, PlayoutFrame
from media.resample import Resampler

log = logging.getLogger(__name__)

FRAME_MS = 20
# Past this much lateness (a stalled loop) the clock is re-anchored instead of bursting frames to catch up.
_MAX_LAG_S = 0.1

PlayoutEvent = Literal["started", "stopped"]
PlayoutCallback = Callable[[PlayoutEvent, str | None], None]
FrameCallback = Callable[[PlayoutFrame], None]
ChunkCallback = Callable[[AudioChunk], Awaitable[None] | None]

# aiortc's audio receiver: a 16-packet reorder window that releases a packet once `prefetch` later
# frames have arrived (aiortc's default 4: 80 ms before the VAD hears anything).
_JITTER_CAPACITY = 16
_RECEIVER_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"


def shorten_audio_reorder_wait(pc: RTCPeerConnection, frames: int) -> bool:
    """Release each incoming audio packet once `frames` later ones have arrived (1: after 20 ms).

    Call after setRemoteDescription, before media flows. Packets later than that are dropped, as
    any packet older than aiortc's window is: on a clean link nothing arrives out of order, and
    the VAD and Whisper shrug off a lost 20 ms. Returns False (and changes nothing) if this aiortc
    keeps its buffer elsewhere."""
    changed = False
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind != "audio" or receiver is None:
            continue
        if not isinstance(getattr(receiver, _RECEIVER_JITTER_BUFFER, None), JitterBuffer):
            log.warning("this aiortc has no audio jitter buffer where expected; keeping its default")
            return False
        setattr(receiver, _RECEIVER_JITTER_BUFFER, JitterBuffer(capacity=_JITTER_CAPACITY, prefetch=frames))
        changed = True
    return changed


class OutboundAudioTrack(MediaStreamTrack):
    """20 ms mono s16 frames from a PlayoutBuffer, paced by the track's own clock.

    aiortc's Opus encoder takes mono or stereo s16 and upmixes itself; G.711 downsamples itself.
    on_event(kind, item_id) runs on the event loop (scheduled with call_soon, so a slow callback
    never delays a frame); so does on_frame(frame), with each frame of audio as it goes out and the one that
    stops it, between its "started" and "stopped" (GPT-Live's words follow the audio the track paces).
    """

    kind = "audio"

    def __init__(self, buffer: PlayoutBuffer, on_event: PlayoutCallback | None = None,
                 on_frame: FrameCallback | None = None) -> None:
        super().__init__()
        if buffer.frame_samples * 1000 != buffer.sample_rate * FRAME_MS:
            raise ValueError(f"the buffer's frames must be {FRAME_MS} ms, got {buffer.frame_samples} at {buffer.sample_rate} Hz")
        self.buffer = buffer
        self._on_event = on_event
        self._on_frame = on_frame
        self._time_base = fractions.Fraction(1, buffer.sample_rate)
        self._start: float | None = None
        self._pts = 0
        self._last_item: str | None = None

    async def recv(self) -> AudioFrame:
        loop = asyncio.get_running_loop()
        rate = self.buffer.sample_rate
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += self.buffer.frame_samples
            wait = self._start + self._pts / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -_MAX_LAG_S:
                self._start = loop.time() - self._pts / rate
        pcm = self._next_pcm(loop)
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        return frame

    def _next_pcm(self, loop: asyncio.AbstractEventLoop) -> np.ndarray:
        try:
            played = self.buffer.read_frame()
        except Exception:  # never let the sender see an exception: it would stop the track for good
            log.exception("playout buffer failed; sending silence")
            return np.zeros(self.buffer.frame_samples, dtype=np.int16)
        self._report(loop, played)
        return played.pcm

    def _report(self, loop: asyncio.AbstractEventLoop, played: PlayoutFrame) -> None:
        if played.item_id is not None:
            self._last_item = played.item_id
        if self._on_event is not None and played.started:
            loop.call_soon(self._on_event, "started", played.item_id)
        if self._on_frame is not None and (played.audio_samples or played.stopped):
            loop.call_soon(self._on_frame, played)
        if self._on_event is not None and played.stopped:
            loop.call_soon(self._on_event, "stopped", self._last_item)


class InboundAudioReader:
    """Drains a remote audio track without pause and hands on mono 16 kHz AudioChunks of 20 ms.

    on_chunk may be sync or async; it should be quick (put the chunk on a queue), because while
    it runs the track is not drained. on_end runs once if the remote track ends (not on close()).
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        on_chunk: ChunkCallback,
        *,
        out_rate: int = 16000,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self._track = track
        self._on_chunk = on_chunk
        self._on_end = on_end
        self.out_rate = out_rate
        self._chunk_samples = out_rate * FRAME_MS // 1000
        self._resampler: Resampler | None = None
        self._pending = np.zeros(0, dtype=np.int16)
        self._task: asyncio.Task[None] | None = None
        self.frames_received = 0

    def start(self) -> InboundAudioReader:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="inbound-audio")
        return self

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        while True:
            try:
                frame = await self._track.recv()
            except MediaStreamError:
                break
            self.frames_received += 1
            for chunk in self._convert(frame):
                await self._deliver(chunk)
        if self._on_end is not None:
            self._on_end()

    def _convert(self, frame: AudioFrame) -> list[AudioChunk]:
        channels = len(frame.layout.channels)
        if self._resampler is None or (self._resampler.in_rate, self._resampler.channels_in) != (frame.sample_rate, channels):
            # Lowest-latency soxr setting: turn timing matters more here than passband above 7 kHz.
            self._resampler = Resampler(frame.sample_rate, self.out_rate, channels, quality="LQ")
        raw = frame.to_ndarray()
        pcm = raw if raw.dtype == np.int16 else float_to_int16(raw.astype(np.float32))
        audio = self._resampler.process(pcm)
        if self._pending.size:
            audio = np.concatenate([self._pending, audio])
        full = audio.shape[0] // self._chunk_samples
        chunks = [
            AudioChunk(audio[i * self._chunk_samples : (i + 1) * self._chunk_samples].copy(), self.out_rate)
            for i in range(full)
        ]
        self._pending = audio[full * self._chunk_samples :]
        return chunks

    async def _deliver(self, chunk: AudioChunk) -> None:
        try:
            result = self._on_chunk(chunk)
            if inspect.isawaitable(result):
                await result
        except Exception:  # a consumer bug must not stop the draining
            log.exception("inbound audio callback failed")
