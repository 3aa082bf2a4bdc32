"""The spoken questions of `--mode voice` and `--mode webrtc`: WAV files from `--audio DIR`, or the text questions
spoken by the embedded Piper voice (loaded once, in a worker thread); 16-bit mono at the rate the mode sends
(24 kHz audio/pcm over the WebSocket, 48 kHz over WebRTC)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from gateway.bench.clients import BenchError
from media.resample import resample


def read_wav(path: Path, rate: int) -> np.ndarray:
    try:
        with wave.open(str(path), "rb") as wav:
            if wav.getsampwidth() != 2:
                raise BenchError(f"{path}: 16-bit PCM WAV only (this one has {8 * wav.getsampwidth()}-bit samples)")
            frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
            channels, wav_rate = wav.getnchannels(), wav.getframerate()
    except (OSError, EOFError, wave.Error) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None
    mono = frames.reshape(-1, channels).mean(axis=1).astype(np.int16) if channels > 1 else frames
    if mono.size == 0:
        raise BenchError(f"{path} holds no audio")
    return resample(mono, wav_rate, rate) if wav_rate != rate else mono


def wav_questions(folder: Path, rate: int) -> list[np.ndarray]:
    files = sorted(folder.glob("*.wav")) if folder.is_dir() else []
    if not files:
        raise BenchError(f"--audio {folder}: no .wav file there")
    return [read_wav(path, rate) for path in files]


def spoken_questions(texts: tuple[str, ...], rate: int) -> list[np.ndarray]:
    """Blocking (a second or two): run it in a thread."""
    from inference.models import ModelNotFound, embedded_tts
    from inference.tts import TtsEngine

    try:
        voice = embedded_tts()
    except ModelNotFound as exc:
        raise BenchError(f"no embedded voice to speak the questions ({exc}): give --audio DIR") from None
    tts = TtsEngine.load(voice, variation=False, warmup=False)
    try:
        return [resample(tts.synthesize_blocking(text), tts.sample_rate, rate) for text in texts]
    finally:
        tts.close()
