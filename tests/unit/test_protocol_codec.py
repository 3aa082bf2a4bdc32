"""The Realtime event codec: every kind of bad input becomes one clear ApiError."""

from __future__ import annotations

import json

import pytest

from gateway.protocol import client_events as ev
from gateway.protocol.codec import decode_client_event, encode_server_event
from gateway.protocol.errors import ApiError

LIMIT = 64 * 1024


def error_of(raw: str | bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        decode_client_event(raw, max_bytes=LIMIT)
    return caught.value


def test_decodes_every_client_event_type() -> None:
    samples = {
        "session.update": {"session": {"instructions": "hi"}},
        "input_audio_buffer.append": {"audio": "AAAA"},
        "input_audio_buffer.commit": {},
        "input_audio_buffer.clear": {},
        "conversation.item.create": {
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
        },
        "conversation.item.retrieve": {"item_id": "item_1"},
        "conversation.item.delete": {"item_id": "item_1"},
        "conversation.item.truncate": {"item_id": "item_1", "content_index": 0, "audio_end_ms": 1500},
        "response.create": {"response": {"output_modalities": ["text"], "instructions": "be brief"}},
        "response.cancel": {},
        "output_audio_buffer.clear": {},
    }
    assert set(samples) == ev.CLIENT_EVENT_TYPES
    for event_type, fields in samples.items():
        event = decode_client_event(json.dumps({"type": event_type, "event_id": "e1", **fields}), max_bytes=LIMIT)
        assert event.type == event_type
        assert event.event_id == "e1"


def test_malformed_json() -> None:
    assert error_of("{not json").code == "invalid_json"
    assert error_of(b"\xff\xfe").code == "invalid_json"
    assert error_of("[1, 2]").code == "invalid_json"


def test_unknown_and_missing_type_keep_the_event_id() -> None:
    error = error_of('{"type": "response.explode", "event_id": "abc"}')
    assert (error.code, error.param, error.event_id) == ("unknown_event_type", "type", "abc")
    error = error_of('{"event_id": "abc"}')
    assert (error.code, error.param, error.event_id) == ("missing_required_parameter", "type", "abc")


def test_missing_and_wrongly_typed_fields_name_the_field() -> None:
    error = error_of('{"type": "conversation.item.retrieve", "event_id": "x"}')
    assert (error.code, error.param, error.event_id) == ("missing_required_parameter", "item_id", "x")
    error = error_of(
        '{"type": "conversation.item.create", "item": {"type": "message", "role": "user",'
        ' "content": [{"type": "input_text", "text": 5}]}}'
    )
    assert (error.code, error.param) == ("invalid_type", "item.content[0].text")
    error = error_of('{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -5}')
    assert (error.code, error.param) == ("invalid_value", "audio_end_ms")
    error = error_of('{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}')
    assert error.param == "item.role"


def test_message_over_the_size_cap() -> None:
    raw = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * LIMIT})
    assert error_of(raw).code == "message_too_large"


def test_server_events_encode_compactly_as_ascii_that_any_text_survives() -> None:
    assert encode_server_event({"type": "x", "text": "café"}) == '{"type":"x","text":"caf\\u00e9"}'
    echoed = encode_server_event({"type": "x", "text": "a\ud800b"})  # a lone surrogate can be written
    assert echoed.isascii() and json.loads(echoed)["text"] == "a\ud800b"
