"""Audio helpers for the voice tests: speech clips at any rate, and what the gateway said back."""

from __future__ import annotations

import base64

import numpy as np

from inference.asr import AsrEngine
from media.codecs import decode_input, encode_output
from media.frames import AudioChunk
from media.resample import resample


def with_silence(pcm: np.ndarray, rate: int, lead_s: float, tail_s: float) -> np.ndarray:
    return np.concatenate([np.zeros(int(rate * lead_s), np.int16), pcm, np.zeros(int(rate * tail_s), np.int16)])


def encode_chunks(pcm: np.ndarray, rate: int, fmt: str, chunk_ms: int = 20) -> list[str]:
    """Split audio into base64 `input_audio_buffer.append` payloads in the given wire format."""
    step = rate * chunk_ms // 1000
    return [
        base64.b64encode(encode_output(fmt, AudioChunk(np.ascontiguousarray(pcm[i : i + step]), rate))).decode()
        for i in range(0, len(pcm), step)
    ]


def decode_deltas(deltas: list[str], fmt: str) -> AudioChunk:
    chunks = [decode_input(fmt, base64.b64decode(delta)) for delta in deltas]
    return AudioChunk(np.concatenate([chunk.pcm for chunk in chunks]), chunks[0].sample_rate)


async def transcribe(asr: AsrEngine, audio: AudioChunk) -> str:
    pcm16k = resample(audio.pcm, audio.sample_rate, 16000)
    transcript = await asr.transcribe(AudioChunk(pcm16k, 16000).to_float32(), final=True)
    assert transcript is not None
    return transcript.text
