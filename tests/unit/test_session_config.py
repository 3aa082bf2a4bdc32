"""Partial session updates merge into the session; bad values name the offending field."""

from __future__ import annotations

import pytest

from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import (
    SEMANTIC_WAITS_MS,
    UNSURE_WAITS_MS,
    SessionConfig,
    SpeechOptions,
    apply_session_update,
    semantic_wait_ms,
    server_vad_wait_ms,
    turn_end_wait_ms,
)


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
        # Fields this server cannot honour are refused by name, never accepted and ignored:
        ({"temperature": 5}, "invalid_value", "session.temperature"),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "now"}}}}, "invalid_value",
         "session.audio.input.turn_detection.eagerness"),
        ({"audio": {"input": {"turn_detection": {"eagerness": "high"}}}}, "unknown_parameter",
         "session.audio.input.turn_detection.eagerness"),
        ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}, "invalid_value",
         "session.audio.input.noise_reduction.type"),
        ({"audio": {"input": {"noise_reduction": {"type": "near_field", "level": 3}}}}, "unknown_parameter",
         "session.audio.input.noise_reduction.level"),
        ({"audio": {"output": {"speed": 3}}}, "invalid_value", "session.audio.output.speed"),
        ({"tool_choice": "required"}, "invalid_value", "session.tool_choice"),
        ({"tracing": "everything"}, "invalid_value", "session.tracing"),
        ({"include": ["item.input_audio_transcription.logprobs"]}, "invalid_value", "session.include"),
        ({"truncation": "disabled"}, "invalid_value", "session.truncation"),
    ],
)
def test_bad_updates(update: dict, code: str, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        apply_session_update(SessionConfig(), update)
    assert (caught.value.code, caught.value.param) == (code, param)


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_noise_reduction_is_served(kind: str) -> None:
    updated = apply_session_update(SessionConfig(), {"audio": {"input": {"noise_reduction": {"type": kind}}}})
    assert updated.audio.input.noise_reduction is not None and updated.audio.input.noise_reduction.type == kind
    cleared = apply_session_update(updated, {"audio": {"input": {"noise_reduction": None}}})
    assert cleared.audio.input.noise_reduction is None


def test_the_judges_set_the_silence_together() -> None:
    """semantic_vad's wait from the audio model and the LLM (auto: 250 ms to 2 s, either judge's shortest 250 ms): words cut off wait the
    longest, or a long mid-thought pause's worth (1.5 s) when they sound finished; otherwise the shorter of the two
    waits; no judge, the longest."""
    assert turn_end_wait_ms("auto") == 2000
    assert turn_end_wait_ms("auto", audio=0.9) == 250
    assert turn_end_wait_ms("auto", audio=0.2) == 2000
    assert turn_end_wait_ms("auto", audio=0.9, text=0.001) == 1500
    assert turn_end_wait_ms("auto", audio=0.2, text=0.001) == turn_end_wait_ms("auto", text=0.001) == 2000
    # Finished words in audio that sounds unfinished: the LLM's probability counts less the less finished it sounds.
    assert turn_end_wait_ms("auto", audio=0.2, text=0.9) == semantic_wait_ms("auto", 0.9 * (0.2 / 0.5) ** 0.5) == 250
    assert turn_end_wait_ms("auto", audio=0.1, text=0.9) == semantic_wait_ms("auto", 0.9 * (0.1 / 0.5) ** 0.5) > 250
    assert turn_end_wait_ms("auto", audio=0.02, text=0.3) == semantic_wait_ms("auto", 0.3 * 0.2) > 700
    assert turn_end_wait_ms("auto", audio=0.02, text=0.3) > turn_end_wait_ms("auto", audio=0.4, text=0.3)
    assert turn_end_wait_ms("auto", text=0.3) == semantic_wait_ms("auto", 0.3)  # no audio model: no doubt
    assert turn_end_wait_ms("auto", audio=0.9, text=0.9) == 250
    assert turn_end_wait_ms("low", audio=0.6) == 4000 and turn_end_wait_ms("high", audio=0.35) == 150
    # Words Whisper was unsure of are no judge's: finished-sounding audio waits a long mid-thought pause,
    # unfinished (or no audio model) the longest; words that are cut off still veto.
    assert turn_end_wait_ms("auto", audio=0.9, text=0.9, words_sure=False) == UNSURE_WAITS_MS["auto"] == 1100
    assert turn_end_wait_ms("auto", audio=0.2, text=0.9, words_sure=False) == 2000
    assert turn_end_wait_ms("auto", text=0.9, words_sure=False) == 2000
    assert turn_end_wait_ms("auto", audio=0.9, text=0.001, words_sure=False) == 1500
    assert turn_end_wait_ms("high", audio=0.9, text=0.9, words_sure=False) == 600
    assert server_vad_wait_ms(500, 0.9) == 500 and server_vad_wait_ms(500, 0.1) == 2000


def test_g711_formats_have_their_rate() -> None:
    updated = apply_session_update(SessionConfig(), {"audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    assert updated.audio.input.format.sample_rate == 8000


def test_the_g711_formats_carry_no_rate_and_pcm_always_says_24000() -> None:
    """GA shapes: `{"type": "audio/pcmu"}` alone, even after audio/pcm (whose 24000 must not carry over)."""
    config = apply_session_update(SessionConfig(), {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
    config = apply_session_update(config, {"audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    assert config.model_dump()["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert config.model_dump()["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    config = apply_session_update(config, {"audio": {"input": {"format": {"type": "audio/pcm"}}}})
    assert config.model_dump()["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}


SPEECH = SpeechOptions(voice="joe", voice_aliases=frozenset({"alloy", "marin"}), transcription_model="whisper-tiny.en",
                       transcription_aliases=frozenset({"whisper-1", "gpt-4o-transcribe"}), transcription_language="en")


@pytest.mark.parametrize("update", [
    {"audio": {"output": {"voice": "marin"}}},
    {"audio": {"output": {"voice": "joe"}}},
    {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe", "language": "en", "prompt": "Paris"}}}},
    {"audio": {"input": {"transcription": None}}},
])
def test_openai_names_select_the_installed_voice_models(update: dict) -> None:
    apply_session_update(SPEECH.apply_defaults(SessionConfig()), update, speech=SPEECH)


@pytest.mark.parametrize(("update", "param"), [
    ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
    ({"audio": {"input": {"transcription": {"model": "parakeet"}}}}, "session.audio.input.transcription.model"),
    ({"audio": {"input": {"transcription": {"language": "fr"}}}}, "session.audio.input.transcription.language"),
])
def test_unknown_voices_models_and_languages_are_refused(update: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        apply_session_update(SPEECH.apply_defaults(SessionConfig()), update, speech=SPEECH)
    assert (caught.value.code, caught.value.param) == ("invalid_value", param)


def test_a_new_session_names_the_installed_voice_and_whisper() -> None:
    audio = SPEECH.apply_defaults(SessionConfig()).model_dump()["audio"]
    assert audio["output"]["voice"] == "joe" and audio["input"]["transcription"]["model"] == "whisper-tiny.en"


def test_temperature_is_kept_across_updates_but_not_echoed() -> None:
    """The beta API's session temperature works (an addition), and GA session objects stay without it."""
    config = apply_session_update(SessionConfig(), {"temperature": 0})
    config = apply_session_update(config, {"instructions": "be brief"})
    assert config.temperature == 0
    assert "temperature" not in config.model_dump()


def test_semantic_vad_replaces_server_vad_and_back() -> None:
    config = apply_session_update(SessionConfig(), {"audio": {"input": {"turn_detection": {"type": "semantic_vad",
                                                                                           "eagerness": "high"}}}})
    assert config.model_dump()["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": True}
    config = apply_session_update(config, {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
    assert config.audio.input.turn_detection is not None and config.audio.input.turn_detection.silence_duration_ms == 400


@pytest.mark.parametrize(("eagerness", "probability", "wait"), [
    ("auto", 0.0, 2000), ("auto", 0.0005, 2000), ("auto", 0.8, 250), ("auto", 0.03, 1042), ("high", 0.5, 250),
    ("medium", 0.8, 250), ("low", 0.5, 600), ("low", 0.0, 4000)])
def test_semantic_waits_shorten_as_the_words_sound_finished(eagerness: str, probability: float, wait: int) -> None:
    assert semantic_wait_ms(eagerness, probability) == wait


def test_another_waits_table_is_replayed_without_changing_the_gateways() -> None:
    """benchmarks/turn_taking.py replays recorded silences on other tables (text_shortest_sweep)."""
    slower = {**SEMANTIC_WAITS_MS, "auto": (400, 2000)}
    assert semantic_wait_ms("auto", 0.9, slower) == turn_end_wait_ms("auto", audio=0.2, text=0.9, waits=slower) == 400
    assert turn_end_wait_ms("auto", audio=0.2, text=0.9) == 250 and SEMANTIC_WAITS_MS["auto"] == (250, 2000)
