"""Each carrier's stream messages, read into the gateway's and written back, from the carriers' published
examples; a bad message is refused by name, never by its payload."""

from __future__ import annotations

import base64
import json

import pytest

from gateway.protocol import carrier_media as carrier
from gateway.protocol.plivo_media import PlivoWire
from gateway.protocol.telnyx_media import TelnyxWire
from gateway.protocol.twilio_media import TwilioWire

AUDIO = b"\xff" * 160
PAYLOAD = base64.b64encode(AUDIO).decode()


def test_twilio_messages() -> None:
    wire = TwilioWire()
    start = wire.parse(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
        "accountSid": "AC1", "streamSid": "MZ1", "callSid": "CA1", "tracks": ["inbound"],
        "customParameters": {"api_key": "k"}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                                                 "channels": 1}}}), {"api_key": "not this"})
    assert start == carrier.StreamStart("MZ1", "CA1", "audio/x-mulaw", 8000, 1, "mulaw", {"api_key": "k"})
    media = wire.parse(json.dumps({"event": "media", "streamSid": "MZ1", "sequenceNumber": "3", "extra": 1,
                                   "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": PAYLOAD}}), {})
    assert media == carrier.StreamAudio(AUDIO)
    assert wire.parse('{"event": "dtmf", "dtmf": {"digit": "5"}}', {}) == carrier.StreamDigit("5")
    assert wire.parse('{"event": "mark", "mark": {"name": "m1"}}', {}) == carrier.StreamPlayed("m1")
    assert wire.parse('{"event": "stop", "stop": {}}', {}) == carrier.StreamStop()
    assert wire.parse('{"event": "connected", "protocol": "Call"}', {}) == carrier.StreamNotice("connected")
    assert wire.parse('{"event": "someday"}', {}) is None  # an event Twilio adds later
    l16 = wire.parse(json.dumps({"event": "start", "start": {"streamSid": "MZ1", "mediaFormat": {
        "encoding": "audio/x-l16", "sampleRate": 16000}}}), {})
    assert isinstance(l16, carrier.StreamStart) and l16.codec is None
    assert json.loads(wire.clear("MZ1")) == {"event": "clear", "streamSid": "MZ1"}
    assert json.loads(wire.mark("MZ1", "m1")) == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m1"}}
    assert json.loads(wire.media("MZ1", AUDIO)) == {"event": "media", "streamSid": "MZ1", "media": {"payload": PAYLOAD}}


def test_telnyx_messages() -> None:
    wire = TelnyxWire()
    start = wire.parse(json.dumps({"event": "start", "sequence_number": "1", "stream_id": "32DE", "start": {
        "user_id": "u", "call_control_id": "v3:abc", "client_state": "aGF2ZQ==",
        "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1}}}), {"session": "{}"})
    assert start == carrier.StreamStart("32DE", "v3:abc", "PCMA", 8000, 1, "alaw", {"session": "{}"})
    assert wire.parse(json.dumps({"event": "media", "sequence_number": "4", "stream_id": "32DE", "media": {
        "track": "inbound", "chunk": "2", "timestamp": "5", "payload": PAYLOAD}}), {}) == carrier.StreamAudio(AUDIO)
    outbound = wire.parse(json.dumps({"event": "media", "media": {"track": "outbound", "payload": PAYLOAD}}), {})
    assert outbound == carrier.StreamNotice("media")  # both_tracks: not the caller's voice
    assert wire.parse('{"event": "dtmf", "stream_id": "32DE", "dtmf": {"digit": "#"}}', {}) == carrier.StreamDigit("#")
    assert wire.parse('{"event": "mark", "mark": {"name": "m2"}}', {}) == carrier.StreamPlayed("m2")
    error = wire.parse('{"event": "error", "payload": {"code": 100003, "title": "t", "detail": "quotes input"}}', {})
    assert error == carrier.StreamNotice("error", error="100003")
    assert wire.parse('{"event": "stop", "stop": {"call_control_id": "v3:abc"}}', {}) == carrier.StreamStop()
    assert json.loads(wire.clear("32DE")) == {"event": "clear", "stream_id": "32DE"}
    assert json.loads(wire.media("32DE", AUDIO))["media"] == {"payload": PAYLOAD}
    assert json.loads(wire.mark("32DE", "m1"))["mark"] == {"name": "m1"}


def test_plivo_messages() -> None:
    wire = PlivoWire()
    start = wire.parse(json.dumps({"event": "start", "sequenceNumber": 1, "start": {
        "callId": "c1", "streamId": "s1", "accountId": "MA1", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}, "extra_headers": "a=1"}), {"api_key": "k"})
    assert start == carrier.StreamStart("s1", "c1", "audio/x-mulaw", 8000, 1, "mulaw", {"api_key": "k"})
    assert wire.parse(json.dumps({"event": "media", "sequenceNumber": 2, "streamId": "s1", "media": {
        "track": "inbound", "timestamp": "1", "chunk": 1, "payload": PAYLOAD}}), {}) == carrier.StreamAudio(AUDIO)
    assert wire.parse('{"event": "dtmf", "dtmf": {"digit": "1", "track": "inbound"}}', {}) == carrier.StreamDigit("1")
    assert wire.parse('{"event": "playedStream", "streamId": "s1", "name": "m3"}', {}) == carrier.StreamPlayed("m3")
    assert wire.parse('{"event": "clearedAudio", "streamId": "s1"}', {}) == carrier.StreamNotice("clearedAudio")
    assert json.loads(wire.media("s1", AUDIO)) == {"event": "playAudio", "streamId": "s1", "media": {
        "contentType": "audio/x-mulaw", "sampleRate": 8000, "payload": PAYLOAD}}
    assert json.loads(wire.mark("s1", "m1")) == {"event": "checkpoint", "streamId": "s1", "name": "m1"}
    assert json.loads(wire.clear("s1")) == {"event": "clearAudio", "streamId": "s1"}


@pytest.mark.parametrize("wire", [TwilioWire(), TelnyxWire(), PlivoWire()], ids=lambda wire: wire.name)
def test_bad_messages_are_refused_by_name(wire: carrier.CarrierWire) -> None:
    with pytest.raises(carrier.CarrierMessageError, match="not JSON"):
        wire.parse("{", {})
    with pytest.raises(carrier.CarrierMessageError, match="with an 'event'"):
        wire.parse("[1]", {})
    with pytest.raises(carrier.CarrierMessageError, match="'dtmf' message is malformed at dtmf"):
        wire.parse('{"event": "dtmf"}', {})
    with pytest.raises(carrier.CarrierMessageError, match="'start' message is malformed at"):
        wire.parse('{"event": "start", "start": {}}', {})
    with pytest.raises(carrier.CarrierMessageError, match="media.payload is not base64") as refused:
        wire.parse('{"event": "media", "media": {"payload": "***secret words***"}}', {})
    assert "secret" not in str(refused.value)
