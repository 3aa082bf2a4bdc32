"""Twilio Media Streams' WebSocket messages, as Twilio publishes them for a bidirectional stream
(`<Connect><Stream url="wss://.../v1/telephony/twilio">`): https://www.twilio.com/docs/voice/media-streams/websocket-messages

Twilio sends `connected`, `start`, `media`, `dtmf`, `mark` and `stop`, one JSON text frame each; the server
sends `media`, `mark` and `clear`. The application's settings come as the stream's `<Parameter>`s
(`start.customParameters`): Twilio drops a query string from the stream URL. Fields Twilio may add later are
ignored; a message whose known fields are missing or of the wrong type is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from gateway.protocol.carrier_media import (
    CarrierModel,
    Inbound,
    MarkingWire,
    StreamNotice,
    StreamStart,
    load_object,
    validated,
)

MULAW = "audio/x-mulaw"  # the one format of a bidirectional stream: G.711 mu-law at 8 kHz, mono


class MediaFormat(CarrierModel):
    encoding: str
    sampleRate: int
    channels: int = 1


class StartInfo(CarrierModel):
    streamSid: str
    callSid: str = ""
    customParameters: dict[str, str] = Field(default_factory=dict)
    mediaFormat: MediaFormat


class Start(CarrierModel):
    streamSid: str = ""
    start: StartInfo


class TwilioWire(MarkingWire):
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
        return self.parse_common(data)
