"""LiveTranslator: the realtime core's (Realtime) events in GPT-Live's words, checked against openai.types.live."""

from __future__ import annotations

from typing import Any

from gateway.protocol.live_events import LiveSessionConfig
from gateway.realtime.live_wire import LiveTranslator, live_error
from tests.integration.sdk_types import assert_valid_live_event

NOW_MS = 5000


def translator(**config: Any) -> LiveTranslator:
    translate = LiveTranslator(LiveSessionConfig(model="gpt-live-1", **config), "gpt-live-1", lambda: NOW_MS)
    translate({"type": "session.created", "session": {
        "id": "sess_1", "expires_at": 1, "instructions": "Be kind.", "audio": {"output": {"voice": "joe"}}}})
    return translate


def valid(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for event in events:
        assert_valid_live_event({"event_id": "event_1", **event})
    return events


def test_session_created_is_session_started_with_the_live_resource() -> None:
    translate = LiveTranslator(LiveSessionConfig(model="gpt-live-1.1", audio={"output": {"voice": "marin"}}),
                               "gpt-live-1.1", lambda: 0)
    [started] = valid(translate({"type": "session.created", "session": {
        "id": "sess_1", "expires_at": 9, "instructions": "Be kind.", "audio": {"output": {"voice": "joe"}}}}))
    assert started["type"] == "session.started"
    assert started["session"] == {
        "id": "sess_1", "expires_at": 9, "model": "gpt-live-1.1", "status": "active", "instructions": "Be kind.",
        "audio": {"format": {"type": "audio/pcm", "rate": 24000}, "output": {"voice": "marin"}}, "store": False}


def test_the_users_words_are_placed_on_the_timeline_and_only_appended() -> None:
    translate = translator()
    translate.input_offset_ms = 1000
    assert translate({"type": "input_audio_buffer.speech_started", "item_id": "i1", "audio_start_ms": 500}) == []
    [first] = valid(translate({"type": "conversation.item.input_audio_transcription.delta", "item_id": "i1",
                               "delta": "What is", "text": "What is the"}))
    assert (first["delta"], first["start_ms"], first["end_ms"]) == ("What is", 1500, NOW_MS)
    translate({"type": "input_audio_buffer.speech_stopped", "item_id": "i1", "audio_end_ms": 2500})
    [rest] = valid(translate({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i1",
                              "transcript": "What is the capital?", "usage": {}}))
    assert (rest["delta"], rest["start_ms"], rest["end_ms"]) == (" the capital?", 1500, 3500)
    # A final that revised what was sent cannot take it back: nothing more is said of the turn.
    translate({"type": "input_audio_buffer.speech_started", "item_id": "i2", "audio_start_ms": 4000})
    translate({"type": "conversation.item.input_audio_transcription.delta", "item_id": "i2", "delta": "Friends"})
    assert translate({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i2",
                      "transcript": "France"}) == []


def test_a_deleted_turn_says_nothing_more_and_empty_deltas_say_nothing() -> None:
    translate = translator()
    translate({"type": "input_audio_buffer.speech_started", "item_id": "i1", "audio_start_ms": 0})
    assert translate({"type": "conversation.item.input_audio_transcription.delta", "item_id": "i1", "delta": ""}) == []
    translate({"type": "conversation.item.deleted", "item_id": "i1"})
    assert translate({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i1",
                      "transcript": "Yeah."}) == []


def test_a_reply_ending_updates_the_usage_and_realtime_book_keeping_says_nothing() -> None:
    translate = translator()
    [usage] = valid(translate({"type": "response.done", "response": {}}))
    assert usage == {"type": "session.usage.updated", "usage": {"seconds": 5.0}}
    for kind in ("response.created", "conversation.item.added", "response.output_audio_transcript.delta",
                 "input_audio_buffer.committed", "session.updated", "rate_limits.updated"):
        assert translate({"type": kind}) == []


def test_errors_keep_their_code_and_name_the_clients_event() -> None:
    [error] = valid([live_error({"message": "No.", "type": "invalid_request_error", "param": None, "code": "x",
                                 "event_id": "evt_1"})])
    assert error == {"type": "error", "client_event_id": "evt_1", "error": {
        "code": "x", "message": "No.", "type": "invalid_request_error", "client_event_id": "evt_1"}}


def test_a_session_past_its_limits_ends_with_session_closed_expired() -> None:
    translate = translator()
    error, closed = valid(translate({"type": "error", "error": {
        "message": "Your session hit the maximum duration.", "type": "invalid_request_error", "param": None,
        "code": "session_expired"}}))
    assert error["error"]["code"] == "session_expired"
    assert (closed["type"], closed["reason"], closed["session"]["id"]) == ("session.closed", "expired", "sess_1")
