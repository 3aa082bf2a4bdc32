"""Plivo Audio Streams' WebSocket messages, as Plivo publishes them for a bidirectional stream
(`<Stream bidirectional="true" contentType="audio/x-mulaw;rate=8000">wss://.../v1/telephony/plivo?...</Stream>`):
https://www.plivo.com/docs/voice/audio-streaming/audio-streaming

Plivo sends `start`, `media`, `dtmf`, `playedStream` (a checkpoint reached) and `clearedAudio`, and ends the stream
by closing the socket; the server sends `playAudio`, `checkpoint` and `clearAudio`. The application's settings
come in the stream URL's query string (`?api_key=...&session=...`): `extraHeaders` takes letters and digits only,
which no JSON session object is. Fields Plivo may add later are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.protocol.carrier_media import (
    SAMPLE_RATE,
    CarrierModel,
    Dtmf,
    Inbound,
    StreamDigit,
    StreamNotice,
    StreamPlayed,
    StreamStart,
    caller_audio,
    encode_payload,
    load_object,
    validated,
)

MULAW = "audio/x-mulaw"


class MediaFormat(CarrierModel):
    encoding: str
    sampleRate: int


class StartInfo(CarrierModel):
    callId: str = ""
    streamId: str
    mediaFormat: MediaFormat


class Start(CarrierModel):
    start: StartInfo


class Played(CarrierModel):
    name: str


class PlivoWire:
    name = "plivo"
    encodings = f"{MULAW} at 8000 Hz (contentType=\"audio/x-mulaw;rate=8000\")"

    def parse(self, raw: str | bytes, query: Mapping[str, str]) -> Inbound | None:
        data = load_object(raw)
        match data["event"]:
            case "start":
                start = validated(Start, data).start
                media_format = start.mediaFormat
                return StreamStart(
                    stream_id=start.streamId, call_id=start.callId, encoding=media_format.encoding,
                    sample_rate=media_format.sampleRate, channels=1,
                    codec="mulaw" if media_format.encoding == MULAW else None, parameters=dict(query))
            case "media":
                return caller_audio(data)
            case "dtmf":
                return StreamDigit(validated(Dtmf, data).dtmf.digit)
            case "playedStream":
                return StreamPlayed(validated(Played, data).name)
            case "clearedAudio":
                return StreamNotice("clearedAudio")
        return None

    def media(self, stream_id: str, g711: bytes) -> str:
        return json.dumps({"event": "playAudio", "streamId": stream_id, "media": {
            "contentType": MULAW, "sampleRate": SAMPLE_RATE, "payload": encode_payload(g711)}})

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "checkpoint", "streamId": stream_id, "name": name})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clearAudio", "streamId": stream_id})
