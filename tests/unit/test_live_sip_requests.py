"""What a GPT-Live SIP call is answered and steered with: accept's body (`client.live.sessions.accept`), reject's
required code, and a sideband's `transport.dtmf.send`. No I/O."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol.call_requests import LiveRejectCall
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import decode_dtmf_send, decode_live_event
from gateway.protocol.live_media import decode_live_accept


def accept(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def test_accept_takes_the_sdks_session_as_session_start_has_it() -> None:
    config = decode_live_accept(accept({"session": {"type": "live", "model": "gpt-live-1", "instructions": "Hi.",
                                                    "audio": {"output": {"voice": "marin"}}}}), max_bytes=1 << 20)
    assert config.model == "gpt-live-1" and config.instructions == "Hi."
    assert config.audio is not None and config.audio.output is not None and config.audio.output.voice == "marin"


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"session": {"model": "gpt-live-1"}}, "missing_required_parameter", "session.type"),
    ({"session": {"type": "realtime", "model": "gpt-live-1"}}, "invalid_value", "session.type"),
    ({"session": {"type": "live", "model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu"}}}},
     "unsupported_value", "session.audio.format"),
    ({"session": {"type": "live", "model": "gpt-live-1", "client": {}}}, "unsupported_value", "session.client"),
    ({"session": {"type": "live", "model": "gpt-live-1", "store": True}}, "unsupported_value", "session.store"),
    ({"session": {"type": "live", "model": "gpt-live-1", "voice": "marin"}}, "unknown_parameter", "session.voice"),
    ({"session": {"type": "live"}}, "missing_required_parameter", "session.model"),
    ({"session": {"type": "live", "model": "gpt-live-1"}, "transport": {}}, "unknown_parameter", "transport"),
    ({"type": "live", "model": "gpt-live-1"}, "invalid_type", "session"),
])
def test_accept_refuses_by_name(body: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(ApiError) as refused:
        decode_live_accept(accept(body), max_bytes=1 << 20)
    assert (refused.value.code, refused.value.param) == (code, param), refused.value.body()


def test_a_live_reject_names_a_final_code() -> None:
    assert LiveRejectCall.model_validate({"status_code": 486}).status_code == 486
    for body in ({}, {"status_code": 200}, {"status_code": 700}):
        with pytest.raises(ValidationError):
            LiveRejectCall.model_validate(body)


def test_a_keypress_is_one_key_of_a_keypad() -> None:
    for key in "0123456789ABCD*#":
        assert decode_dtmf_send(json.dumps({"type": "transport.dtmf.send", "event": key}), max_bytes=4096).event == key
    for bad in ("x", "12", "", "a"):
        with pytest.raises(ApiError) as refused:
            decode_dtmf_send(json.dumps({"type": "transport.dtmf.send", "event": bad, "event_id": "e1"}),
                             max_bytes=4096)
        assert refused.value.param == "event" and refused.value.event_id == "e1"


def test_a_primary_connection_is_told_that_digits_are_a_sideband_s() -> None:
    with pytest.raises(ApiError) as refused:
        decode_live_event(json.dumps({"type": "transport.dtmf.send", "event": "1"}), max_bytes=4096)
    assert refused.value.code == "unsupported_event" and "sideband" in refused.value.message
