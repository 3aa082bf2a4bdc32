"""Audio helpers for the voice tests: speech clips at any rate, and what the gateway said back."""

from __future__ import annotations

import base64
import difflib
import re

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


# Whisper tiny.en mishears a word now and then, and which word depends on the CPU: its kernels round differently
# on AVX512 and on AVX2 ("What is the capital of France?" was heard as "... of friends?" on an AMD AVX2 host, and
# "France is" as "Francis" here). A test compares what was heard with what was said within this margin, letter by
# letter (a word heard as two, or two as one, costs little), and never asserts that one word was heard.
HEARD_AS_SAID = 0.8  # "... of friends?" 0.88; the question twice over 0.66, its first four words 0.79


def words(text: str) -> list[str]:
    """The words of a text, lowercase, without punctuation."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def _letters(text: str) -> str:
    return " ".join(words(text))


def heard_as(heard: str, said: str) -> float:
    """How closely `heard` follows `said`, in order: difflib's ratio of the two texts' words, lowercase and
    without punctuation (1.0: the same words; 0.0: nothing in common)."""
    return difflib.SequenceMatcher(a=_letters(said), b=_letters(heard), autojunk=False).ratio()


def heard_within(heard: str, said: str) -> float:
    """The share of `heard` found in `said`, in order (0.0 when nothing was heard): for audio that may hold only
    part of a long text (Whisper hears its first 30 s)."""
    heard_text = _letters(heard)
    blocks = difflib.SequenceMatcher(a=_letters(said), b=heard_text, autojunk=False).get_matching_blocks()
    return sum(block.size for block in blocks) / len(heard_text) if heard_text else 0.0
