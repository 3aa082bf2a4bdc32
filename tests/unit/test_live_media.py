"""POST /v1/live/sessions' body (live_media.py): a Live session's configuration as session.start has it, what only
a media session has (the front end's data channel capabilities), and what a sideband is sent of its audio."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from gateway.protocol.errors import ApiError
from gateway.protocol.live_media import decode_live_create, peek_event
from gateway.realtime.live_reflection import SidebandReflection
from gateway.realtime.outbox import Outbox
from media.frames import AudioChunk
from tests.integration.sdk_types import assert_valid_live_event


def body(**session: Any) -> bytes:
    return json.dumps({"session": {"model": "gpt-live-1", **session},
                       "transport": {"type": "webrtc", "sdp": "v=0"}}).encode()


def test_the_session_is_configured_as_session_start_has_it_with_its_front_ends_capabilities() -> None:
    client = {"data_channel": {"allowed_client_events": ["session.update"],
                               "allowed_server_events": [{"type": "session.updated"},
                                                         {"type": "response.event",
                                                          "response_event": "response.output_text.delta"}]}}
    create = decode_live_create(body(instructions="Be kind.", client=client,
                                     wake_policy={"type": "speech", "vad_threshold": 0.7}), max_bytes=1 << 20)
    assert create.sdp == "v=0" and create.session.instructions == "Be kind." and create.session.client == client
    permissions = create.permissions
    assert permissions.allows_client("session.update") and not permissions.allows_client("session.close")
    assert permissions.allows_server({"type": "session.updated"})
    assert not permissions.allows_server({"type": "session.output_transcript.delta"})
    assert permissions.allows_server({"type": "response.event", "event": {"type": "response.output_text.delta"}})
    assert not permissions.allows_server({"type": "response.event", "event": {"type": "response.completed"}})
    assert "session.update" in permissions.describe()


def test_without_capabilities_or_with_all_nothing_is_restricted() -> None:
    assert not decode_live_create(body(), max_bytes=1 << 20).permissions.restricted
    everything = {"data_channel": {"allowed_client_events": "all", "allowed_server_events": "all"}}
    assert not decode_live_create(body(client=everything), max_bytes=1 << 20).permissions.restricted
    nothing = decode_live_create(body(client={"data_channel": {"allowed_client_events": [],
                                                               "allowed_server_events": []}}),
                                 max_bytes=1 << 20).permissions
    assert not nothing.allows_client("session.update") and not nothing.allows_server({"type": "error"})


@pytest.mark.parametrize(("session", "code", "param"), [
    ({"audio": {"format": {"type": "audio/pcm"}}}, "unsupported_value", "session.audio.format"),
    ({"idle_timeout_s": 30}, "unsupported_value", "session.idle_timeout_s"),
    ({"store": True}, "unsupported_value", "session.store"),
    ({"voice": "marin"}, "unknown_parameter", "session.voice"),
    ({"client": {"data_channel": {"allowed_client_events": ["session.nope"]}}}, "invalid_value",
     "session.client.data_channel"),
    ({"client": {"data_channel": {"allowed_server_events": [{"type": "response.event"}]}}}, "invalid_value",
     "session.client.data_channel.allowed_server_events[0]"),
    ({"wake_policy": {"type": "speech", "vad_threshold": 2}}, "invalid_value", "session.wake_policy.vad_threshold"),
])
def test_what_cannot_be_served_is_refused_by_name(session: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(ApiError) as refused:
        decode_live_create(body(**session), max_bytes=1 << 20)
    assert (refused.value.code, refused.value.param) == (code, param), refused.value


def test_the_transport_is_webrtc_with_an_offer() -> None:
    for transport, param in (({"type": "sip", "sdp": "v=0"}, "transport.type"), ({"type": "webrtc"}, "transport.sdp")):
        with pytest.raises(ApiError) as refused:
            decode_live_create(json.dumps({"session": {"model": "gpt-live-1"}, "transport": transport}).encode(),
                               max_bytes=1 << 20)
        assert refused.value.param == param


def test_a_message_is_peeked_at_without_trusting_it() -> None:
    assert peek_event('{"type": "session.update", "event_id": "e1"}', max_bytes=100) == ("session.update", "e1")
    assert peek_event('{"type": 1}', max_bytes=100) == (None, None)
    assert peek_event("[", max_bytes=100) == (None, None)
    assert peek_event('{"type": "session.update"}', max_bytes=5) == (None, None)


async def test_a_sideband_hears_both_ways_at_24_khz_and_the_output_on_the_timeline() -> None:
    outbox = Outbox(numbered=False)
    now = [1000]
    reflection = SidebandReflection(outbox, 48000, lambda: now[0])
    reflection.input(AudioChunk(np.zeros(320, np.int16), 16000))  # nobody watches: nothing made
    tap = outbox.tap()
    for _ in range(5):
        reflection.input(AudioChunk(np.full(320, 1000, np.int16), 16000))
        reflection.output(np.full(960, 1000, np.int16))
    outbox.close()
    events = []
    while (wire := await tap.next()) is not None:
        events.append(json.loads(wire))
    for event in events:
        assert_valid_live_event(event)
    heard = [e for e in events if e["type"] == "session.input_audio.append"]
    played = [e for e in events if e["type"] == "session.output_audio.delta"]
    assert heard and played and all("event_id" not in e for e in events)
    assert sum(len(base64.b64decode(e["audio"])) for e in heard) <= 5 * 480 * 2  # 24 kHz: 480 samples a frame
    for before, after in zip(played, played[1:], strict=False):
        assert before["start_ms"] < before["end_ms"] <= after["start_ms"]  # the clock stood still: never overlapping
