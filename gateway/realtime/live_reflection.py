"""What a GPT-Live sideband hears: the session's audio both ways, reflected to it as OpenAI's sideband has it.

The user's audio is reflected as it arrives from the primary transport (before muting: the sideband hears what the
user said, the model hears silence) as `session.input_audio.append` server events, with no id or timestamps; the
assistant's as it goes out, as `session.output_audio.delta` with its place on the session's timeline. Both are mono
PCM16LE at 24 kHz whatever the primary transport carries, resampled from its own audio (the caller's, not the 16 kHz
the model hears: audio/pcm at 24 kHz is reflected sample for sample). Only a sideband is sent these
(Outbox.reflect), and nothing is resampled while none watches.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np

from gateway.realtime.outbox import Outbox
from media.codecs import array_to_pcm16
from media.frames import AudioChunk
from media.resample import Resampler

SIDEBAND_RATE = 24000


class SidebandReflection:
    def __init__(self, outbox: Outbox, output_rate: int, clock_ms: Callable[[], int]) -> None:
        self._outbox = outbox
        self._clock_ms = clock_ms
        self._input: Resampler | None = None  # made for the rate the input comes at
        self._output = Resampler(output_rate, SIDEBAND_RATE)
        self._output_end_ms = 0  # where the last reflected output ended: ranges never overlap

    def input(self, chunk: AudioChunk) -> None:
        if not self._outbox.tapped:
            return
        if self._input is None or self._input.in_rate != chunk.sample_rate:
            self._input = Resampler(chunk.sample_rate, SIDEBAND_RATE)
        pcm = self._input.process(chunk.pcm)
        if pcm.size:
            self._outbox.reflect({"type": "session.input_audio.append", "audio": _b64(pcm)})

    def output(self, pcm: np.ndarray) -> None:
        """A frame of the assistant's audio (at the playout's rate) as it goes out."""
        if not self._outbox.tapped:
            return
        reflected = self._output.process(pcm)
        if not reflected.size:
            return
        start_ms = max(self._clock_ms(), self._output_end_ms)
        self._output_end_ms = start_ms + round(1000 * reflected.size / SIDEBAND_RATE)
        self._outbox.reflect({"type": "session.output_audio.delta", "delta": _b64(reflected), "start_ms": start_ms,
                              "end_ms": self._output_end_ms})


def _b64(pcm: np.ndarray) -> str:
    return base64.b64encode(array_to_pcm16(pcm)).decode("ascii")
