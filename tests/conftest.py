"""Real models shared by every test package, loaded once per session: Whisper tiny.en and the Piper voice."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from inference.asr import AsrEngine
from inference.models import embedded_asr, embedded_tts
from inference.tts import TtsEngine
from media.resample import resample

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="session")
def asr() -> Iterator[AsrEngine]:
    engine = AsrEngine.load(embedded_asr(), "cpu", threads=2)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tts() -> Iterator[TtsEngine]:
    engine = TtsEngine.load(embedded_tts(), threads=1, variation=False)  # the same question every run
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def question_pcm(tts: TtsEngine) -> np.ndarray:
    """Piper saying the question, int16 at the voice's rate (22050 Hz)."""
    return tts.synthesize_blocking(QUESTION)


@pytest.fixture(scope="session")
def question_16k(tts: TtsEngine, question_pcm: np.ndarray) -> np.ndarray:
    return resample(question_pcm, tts.sample_rate, 16000)
