"""Partial session updates merge into the session; bad values name the offending field."""

from __future__ import annotations

import pytest

from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig, apply_session_update


def test_partial_update_keeps_other_fields() -> None:
    config = SessionConfig(instructions="a")
    updated = apply_session_update(config, {"audio": {"input": {"turn_detection": {"silence_duration_ms": 700}}}})
    assert updated.instructions == "a"
    assert updated.audio.input.turn_detection is not None
    assert updated.audio.input.turn_detection.silence_duration_ms == 700
    assert updated.audio.input.turn_detection.threshold == 0.5


def test_null_turn_detection_means_manual_turns() -> None:
    updated = apply_session_update(SessionConfig(), {"audio": {"input": {"turn_detection": None}}})
    assert updated.audio.input.turn_detection is None


@pytest.mark.parametrize(
    ("update", "code", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/flac"}}}}, "invalid_value", "session.audio.input.format.type"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "invalid_value", "session.audio.input.format.rate"),
        ({"output_modalities": ["text", "audio"]}, "invalid_value", "session.output_modalities"),
        ({"instructions": 5}, "invalid_type", "session.instructions"),
        ({"max_output_tokens": 0}, "invalid_value", "session.max_output_tokens"),
        ({"voice_of_god": True}, "unknown_parameter", "session.voice_of_god"),
        ({"id": "sess_other"}, "invalid_value", "session.id"),
    ],
)
def test_bad_updates(update: dict, code: str, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        apply_session_update(SessionConfig(), update)
    assert (caught.value.code, caught.value.param) == (code, param)


def test_g711_formats_have_their_rate() -> None:
    updated = apply_session_update(SessionConfig(), {"audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    assert updated.audio.input.format.sample_rate == 8000
