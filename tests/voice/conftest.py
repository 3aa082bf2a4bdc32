"""Silero VAD v6 for the voice tests (Whisper and Piper fixtures live in tests/conftest.py)."""

from __future__ import annotations

import pytest

from inference.models import silero_vad_path
from media.vad import SileroVad


@pytest.fixture
def silero() -> SileroVad:
    return SileroVad(silero_vad_path())
