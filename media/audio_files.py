"""Audio files: any container and codec FFmpeg reads, decoded for Whisper; speech encoded as it is made.

Blocking (FFmpeg through PyAV): call from a worker thread. Decoding stops at a bound on the audio's
length, so a small compressed file cannot unpack into gigabytes.
"""

from __future__ import annotations

import io
from typing import Literal

import av
import av.error
import numpy as np

OutputFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
OUTPUT_RATE = 24000  # what OpenAI's speech endpoint sends in every format (pcm is documented as 24 kHz)
# format -> (container, codec, content type)
_CONTAINERS: dict[str, tuple[str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
    "flac": ("flac", "flac", "audio/flac"),
}
CONTENT_TYPES: dict[str, str] = {**{fmt: spec[2] for fmt, spec in _CONTAINERS.items()}, "wav": "audio/wav", "pcm": "audio/pcm"}


class AudioFileError(ValueError):
    """The bytes are not audio FFmpeg can decode, or hold none."""


class AudioTooLong(AudioFileError):
    pass


def decode_file(data: bytes, *, rate: int = 16000, max_seconds: float) -> np.ndarray:
    """The first audio stream of `data` as float32 mono at `rate`."""
    if not data:
        raise AudioFileError("The file is empty.")
    limit = int(max_seconds * rate)
    pieces: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise AudioFileError("The file has no audio stream.")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1).copy())
                    total += pieces[-1].shape[0]
                if total > limit:
                    raise AudioTooLong(f"The audio is longer than the {max_seconds:.0f} s this server transcribes.")
            for out in resampler.resample(None):
                pieces.append(out.to_ndarray().reshape(-1).copy())
    except AudioFileError:
        raise
    except (av.error.FFmpegError, ValueError, EOFError) as exc:  # unknown container, corrupt stream, bad header
        raise AudioFileError(f"The file is not audio this server can decode ({type(exc).__name__}).") from None
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if audio.shape[0] == 0:
        raise AudioFileError("The file holds no audio samples.")
    return audio[:limit].astype(np.float32, copy=False)


class _Sink:
    """A write-only file for FFmpeg's muxer: what it wrote since the last take."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class StreamEncoder:
    """Mono int16 PCM at OUTPUT_RATE in, bytes of the file out as soon as the encoder gives them.

    wav is streamed with its length unknown (0xFFFFFFFF in the header, as streaming servers send it);
    pcm is raw 16-bit little-endian samples."""

    def __init__(self, fmt: OutputFormat) -> None:
        self.format = fmt
        self.content_type = CONTENT_TYPES[fmt]
        self._sink = _Sink()
        self._container: av.container.OutputContainer | None = None
        self._pts = 0
        self._header = b""
        if fmt in _CONTAINERS:
            container_name, codec, _ = _CONTAINERS[fmt]
            # Ogg pages of 20 ms (its default holds a second of audio back before it writes a page).
            options = {"page_duration": "20000"} if container_name == "ogg" else {}
            self._container = av.open(self._sink, mode="w", format=container_name, options=options)
            self._stream = self._container.add_stream(codec, rate=OUTPUT_RATE)
            self._stream.layout = "mono"  # type: ignore[union-attr]
            if fmt == "mp3":
                self._stream.bit_rate = 64000  # type: ignore[union-attr]
        elif fmt == "wav":
            self._header = _wav_header(OUTPUT_RATE)

    def write(self, pcm: np.ndarray) -> bytes:
        if self._container is None:
            head, self._header = self._header, b""
            return head + np.asarray(pcm, dtype="<i2").tobytes()
        if len(pcm) == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(np.asarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self._pts
        self._pts += len(pcm)
        for packet in self._stream.encode(frame):  # type: ignore[union-attr]
            self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        """The rest: the encoder's delayed frames and the container's trailer."""
        if self._container is None:
            head, self._header = self._header, b""
            return head
        for packet in self._stream.encode(None):  # type: ignore[union-attr]
            self._container.mux(packet)
        self._container.close()
        self._container = None
        return self._sink.take()


def _wav_header(rate: int) -> bytes:
    unknown = 0xFFFFFFFF
    return b"".join([
        b"RIFF", unknown.to_bytes(4, "little"), b"WAVE",
        b"fmt ", (16).to_bytes(4, "little"), (1).to_bytes(2, "little"), (1).to_bytes(2, "little"),
        rate.to_bytes(4, "little"), (rate * 2).to_bytes(4, "little"), (2).to_bytes(2, "little"), (16).to_bytes(2, "little"),
        b"data", unknown.to_bytes(4, "little"),
    ])  # fmt: skip
