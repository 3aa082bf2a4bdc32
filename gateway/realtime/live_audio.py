"""A GPT-Live session's audio on its wire: audio/pcm at 16 or 24 kHz, or G.711 at 8 kHz, base64 both ways; what
the client sends is decoded at its own rate (what a sideband hears), then resampled to the 16 kHz the VAD and
Whisper take. No I/O."""

from __future__ import annotations

import base64
import binascii

import numpy as np

from gateway.protocol.errors import ApiError
from media.codecs import alaw_decode, alaw_encode, array_to_pcm16, pcm16_to_array, ulaw_decode, ulaw_encode
from media.frames import AudioChunk
from media.resample import Resampler

ASR_RATE = 16000


class LiveAudioStream:
    """The session's input at `rate` (the wire format's: audio/pcm at 16 or 24 kHz, G.711 at 8 kHz; over WebRTC,
    the track's), 16 kHz for the ASR, and the wire format both ways."""

    def __init__(self, kind: str, rate: int) -> None:
        self.kind = kind
        self.rate = rate
        self._to_asr = Resampler(rate, ASR_RATE)

    def decode(self, audio_b64: str) -> AudioChunk:
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("invalid_audio", "'audio' is not valid base64.", "audio") from None
        if self.kind == "audio/pcm":
            if len(data) % 2:
                raise ApiError("invalid_audio", "audio/pcm is 16-bit: an odd number of bytes was sent.", "audio")
            pcm = pcm16_to_array(data)
        else:
            pcm = ulaw_decode(data) if self.kind == "audio/pcmu" else alaw_decode(data)
        return AudioChunk(pcm, self.rate)

    def to_asr(self, chunk: AudioChunk) -> AudioChunk:
        """A chunk of the session's input (at its rate) at the 16 kHz the VAD and Whisper take."""
        if chunk.sample_rate != self.rate:
            raise ValueError(f"the session's input is at {self.rate} Hz, not {chunk.sample_rate}")
        return AudioChunk(self._to_asr.process(chunk.pcm), ASR_RATE)

    def encode(self, pcm: np.ndarray) -> str:
        if self.kind == "audio/pcm":
            data = array_to_pcm16(pcm)
        else:
            data = ulaw_encode(pcm) if self.kind == "audio/pcmu" else alaw_encode(pcm)
        return base64.b64encode(data).decode("ascii")
