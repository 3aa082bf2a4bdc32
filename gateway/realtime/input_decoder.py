"""A client's input audio (input_audio_buffer.append): base64 in the session's input format, decoded to the
16 kHz mono that the VAD and Whisper take. No I/O."""

from __future__ import annotations

import base64
import binascii

from gateway.protocol.errors import ApiError
from gateway.realtime.input_buffer import RATE
from media.codecs import AudioFormatError, decode_input
from media.frames import AudioChunk
from media.resample import Resampler


class InputDecoder:
    def __init__(self) -> None:
        # One resampler per format, kept across appends: its filter carries over from one chunk to the next.
        self._resampler: tuple[str, Resampler] | None = None

    def decode(self, audio_b64: str, fmt: str) -> AudioChunk:
        """base64 in the format `fmt` -> 16 kHz mono; a refused chunk raises ApiError."""
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("invalid_audio", "'audio' is not valid base64.", "audio") from None
        try:
            chunk = decode_input(fmt, data)
        except AudioFormatError as exc:
            raise ApiError("invalid_audio", f"Audio does not match the session's format {fmt}: {exc}.", "audio") from None
        if chunk.sample_rate == RATE:
            return chunk
        if self._resampler is None or self._resampler[0] != fmt:
            self._resampler = (fmt, Resampler(chunk.sample_rate, RATE))
        return AudioChunk(self._resampler[1].process(chunk.pcm), RATE)
