"""Telnyx Media Streaming's WebSocket messages, as Telnyx publishes them for a bidirectional RTP stream
(Call Control's `stream_url` with `stream_bidirectional_mode: "rtp"`):
https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming

Telnyx sends `connected`, `start`, `media`, `dtmf`, `mark`, `error` and `stop`, the stream's id at the top level
(`stream_id`), the call's in `start.call_control_id`; the server sends `media`, `mark` and `clear`. The
application's settings come in the stream URL's query string (`?api_key=...&session=...`): `client_state` is the
application's own and is left alone. Fields Telnyx may add later are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.protocol.carrier_media import (
    CarrierModel,
    Encoding,
    Inbound,
    MarkingWire,
    StreamNotice,
    StreamStart,
    load_object,
    validated,
)

CODECS: dict[str, Encoding] = {"PCMU": "mulaw", "PCMA": "alaw"}


class MediaFormat(CarrierModel):
    encoding: str
    sample_rate: int
    channels: int = 1


class StartInfo(CarrierModel):
    call_control_id: str = ""
    media_format: MediaFormat


class Start(CarrierModel):
    stream_id: str
    start: StartInfo


class ErrorInfo(CarrierModel):
    code: int | str = ""


class Error(CarrierModel):
    payload: ErrorInfo = ErrorInfo()


class TelnyxWire(MarkingWire):
    name = "telnyx"
    id_key = "stream_id"
    encodings = "PCMU or PCMA at 8000 Hz, mono (stream_bidirectional_mode rtp, the call's own codec)"

    def parse(self, raw: str | bytes, query: Mapping[str, str]) -> Inbound | None:
        data = load_object(raw)
        match data["event"]:
            case "connected":
                return StreamNotice("connected")
            case "start":
                start = validated(Start, data)
                media_format = start.start.media_format
                return StreamStart(
                    stream_id=start.stream_id, call_id=start.start.call_control_id, encoding=media_format.encoding,
                    sample_rate=media_format.sample_rate, channels=media_format.channels,
                    codec=CODECS.get(media_format.encoding.upper()), parameters=dict(query))
            case "error":
                return StreamNotice("error", error=str(validated(Error, data).payload.code) or "unknown")
        return self.parse_common(data)
