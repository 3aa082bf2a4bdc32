"""Telnyx Media Streaming's WebSocket messages, as Telnyx publishes them for a bidirectional RTP stream
(Call Control's `stream_url` with `stream_bidirectional_mode: "rtp"`):
https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming

Telnyx sends `connected`, `start`, `media`, `dtmf`, `mark`, `error` and `stop`, the stream's id at the top level
(`stream_id`), the call's in `start.call_control_id`; the server sends `media`, `mark` and `clear`. The
application's settings come in the stream URL's query string (`?api_key=...&session=...`): `client_state` is the
application's own and is left alone. Fields Telnyx may add later are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from gateway.protocol.carrier_media import (
    Encoding,
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

CODECS: dict[str, Encoding] = {"PCMU": "mulaw", "PCMA": "alaw"}


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MediaFormat(_Message):
    encoding: str
    sample_rate: int
    channels: int = 1


class StartInfo(_Message):
    call_control_id: str = ""
    media_format: MediaFormat


class Start(_Message):
    stream_id: str
    start: StartInfo


class MediaInfo(_Message):
    track: str = "inbound"
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


class ErrorInfo(_Message):
    code: int | str = ""


class Error(_Message):
    payload: ErrorInfo = ErrorInfo()


class TelnyxWire:
    name = "telnyx"
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
            case "media":
                media = validated(Media, data).media
                if media.track != "inbound":  # both_tracks: what the far end hears is not the caller
                    return StreamNotice("media")
                return StreamAudio(decode_payload(media.payload, "media.payload"))
            case "dtmf":
                return StreamDigit(validated(Dtmf, data).dtmf.digit)
            case "mark":
                return StreamPlayed(validated(Mark, data).mark.name)
            case "error":
                return StreamNotice("error", error=str(validated(Error, data).payload.code) or "unknown")
            case "stop":
                return StreamStop()
        return None

    def media(self, stream_id: str, g711: bytes) -> str:
        return json.dumps({"event": "media", "stream_id": stream_id, "media": {"payload": encode_payload(g711)}})

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "mark", "stream_id": stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clear", "stream_id": stream_id})
