"""Voices the gateway did not tune to: espeak-ng's (Debian `espeak-ng`), with its variants and speeds, speaking
any text at any sample rate, as `benchmarks.voice_audio.Speaker` (Piper, the gateway's own output voice) does."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from dataclasses import dataclass

import numpy as np

from benchmarks.voice_audio import Clip, speech_span

ESPEAK_TIMEOUT_S = 60


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


@dataclass(frozen=True)
class EspeakSpeaker:
    """One espeak-ng voice (`en-us`, `en-gb-scotland`, `en-us+f3` for a variant) at `speed` words a minute."""

    voice: str = "en-us"
    speed: int = 175  # espeak-ng's default

    @property
    def name(self) -> str:
        return f"espeak:{self.voice}@{self.speed}"

    def say(self, text: str, rate: int) -> Clip:
        from media.resample import resample

        binary = shutil.which("espeak-ng")
        if binary is None:
            raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
        wav = subprocess.run([binary, "-v", self.voice, "-s", str(self.speed), "--stdout", text],
                             check=True, capture_output=True, timeout=ESPEAK_TIMEOUT_S).stdout
        with wave.open(io.BytesIO(wav)) as reader:
            source_rate = reader.getframerate()
            # espeak-ng's header gives a streamed length; the samples are what is there.
            pcm = np.frombuffer(reader.readframes(reader.getnframes() or 1 << 30), dtype="<i2")
        pcm = resample(pcm.astype(np.int16), source_rate, rate)
        onset, end = speech_span(pcm, rate)
        return Clip(text, pcm, rate, onset, end)
