"""Test speech made by Piper (the embedded voice): clips, where speech starts and ends, WAV files."""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FRAME_MS = 10
SPEECH_DBFS = -45.0  # a 10 ms frame louder than this counts as speech


@dataclass(frozen=True)
class Clip:
    """int16 mono speech at `rate`; `onset`/`end` are the first and last speech samples (+1)."""

    text: str
    pcm: np.ndarray
    rate: int
    onset: int
    end: int

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / self.rate

    @property
    def speech_s(self) -> float:
        return (self.end - self.onset) / self.rate


def speech_span(pcm: np.ndarray, rate: int, threshold_dbfs: float = SPEECH_DBFS) -> tuple[int, int]:
    """(first, last + 1) sample of the 10 ms frames louder than the threshold; (0, 0) for silence."""
    frame = rate * FRAME_MS // 1000
    count = len(pcm) // frame
    if count == 0:
        return 0, 0
    frames = pcm[: count * frame].astype(np.float64).reshape(count, frame) / 32768.0
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms > 10 ** (threshold_dbfs / 20))
    if loud.size == 0:
        return 0, 0
    return int(loud[0] * frame), int(min(len(pcm), (loud[-1] + 1) * frame))


class Speaker:
    """Piper, loaded once in this process (about 1-3 s), saying texts at any sample rate, the same take every time."""

    name = "piper:joe"  # the embedded voice: the gateway's own output voice

    def __init__(self, threads: int = 1) -> None:
        from inference.models import embedded_tts
        from inference.tts import TtsEngine

        path = embedded_tts()
        self.tts = TtsEngine.load(path, path.with_name(path.name + ".json"), threads=threads, variation=False)

    def say(self, text: str, rate: int) -> Clip:
        from media.resample import resample

        pcm = resample(self.tts.synthesize_blocking(text), self.tts.sample_rate, rate)
        onset, end = speech_span(pcm, rate)
        return Clip(text, pcm, rate, onset, end)

    def close(self) -> None:
        self.tts.close()


def with_silence(clip: Clip, lead_s: float, trail_s: float) -> Clip:
    lead = np.zeros(round(lead_s * clip.rate), dtype=np.int16)
    trail = np.zeros(round(trail_s * clip.rate), dtype=np.int16)
    pcm = np.concatenate([lead, clip.pcm, trail])
    return Clip(clip.text, pcm, clip.rate, clip.onset + len(lead), clip.end + len(lead))


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> Path:
    """16-bit mono PCM WAV."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    return path
