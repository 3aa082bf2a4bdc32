"""Twilio Media Streams' WebSocket messages, as Twilio publishes them for a bidirectional stream
(`<Connect><Stream url="wss://.../v1/telephony/twilio">`): https://www.twilio.com/docs/voice/media-streams/websocket-messages

Twilio sends `connected`, `start`, `media`, `dtmf`, `mark` and `stop`, one JSON text frame each; the server
sends `media`, `mark` and `clear`. The application's settings come as the stream's `<Parameter>`s
(`start.customParameters`): Twilio drops a query string from the stream URL. Fields Twilio may add later are
ignored; a message whose known fields are missing or of the wrong type is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from gateway.protocol.carrier_media import (
    Inbound,
    StreamAudio,
    StreamDigit,
    StreamNotice,
    StreamPlayed,
    StreamStart,
    StreamStop,
    decode_payload,
    encode_payload,
    load_object,
    validated,
)

MULAW = "audio/x-mulaw"  # the one format of a bidirectional stream: G.711 mu-law at 8 kHz, mono


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MediaFormat(_Message):
    encoding: str
    sampleRate: int
    channels: int = 1


class StartInfo(_Message):
    streamSid: str
    callSid: str = ""
    customParameters: dict[str, str] = Field(default_factory=dict)
    mediaFormat: MediaFormat


class Start(_Message):
    streamSid: str = ""
    start: StartInfo


class MediaInfo(_Message):
    payload: str


class Media(_Message):
    media: MediaInfo


class DtmfInfo(_Message):
    digit: str


class Dtmf(_Message):
    dtmf: DtmfInfo


class MarkInfo(_Message):
    name: str


class Mark(_Message):
    mark: MarkInfo


class TwilioWire:
    name = "twilio"
    encodings = f"{MULAW} at 8000 Hz, mono (a bidirectional stream)"

    def parse(self, raw: str | bytes, query: Mapping[str, str]) -> Inbound | None:
        data = load_object(raw)
        match data["event"]:
            case "connected":
                return StreamNotice("connected")
            case "start":
                start = validated(Start, data).start
                media_format = start.mediaFormat
                return StreamStart(
                    stream_id=start.streamSid or data.get("streamSid", ""), call_id=start.callSid,
                    encoding=media_format.encoding, sample_rate=media_format.sampleRate,
                    channels=media_format.channels, codec="mulaw" if media_format.encoding == MULAW else None,
                    parameters=dict(start.customParameters))
            case "media":
                return StreamAudio(decode_payload(validated(Media, data).media.payload, "media.payload"))
            case "dtmf":
                return StreamDigit(validated(Dtmf, data).dtmf.digit)
            case "mark":
                return StreamPlayed(validated(Mark, data).mark.name)
            case "stop":
                return StreamStop()
        return None

    def media(self, stream_id: str, g711: bytes) -> str:
        return json.dumps({"event": "media", "streamSid": stream_id, "media": {"payload": encode_payload(g711)}})

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "mark", "streamSid": stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clear", "streamSid": stream_id})
