"""Twilio Media Streams' WebSocket messages, as Twilio publishes them for a bidirectional stream
(`<Connect><Stream url="wss://.../v1/telephony/twilio">`): https://www.twilio.com/docs/voice/media-streams/websocket-messages

Twilio sends `connected`, `start`, `media`, `dtmf`, `mark` and `stop`, one JSON text frame each; the server
sends `media`, `mark` and `clear`. Fields Twilio may add later are ignored; a message whose known fields are
missing or of the wrong type is refused by name (TwilioMessageError).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# The one format of a bidirectional stream: G.711 mu-law at 8 kHz, mono.
MULAW = "audio/x-mulaw"
SAMPLE_RATE = 8000


class TwilioMessageError(ValueError):
    """A message that is not Twilio's: its event and what is wrong with it (never its payload)."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Connected(_Message):
    event: Literal["connected"]
    protocol: str = "Call"
    version: str = "1.0.0"


class MediaFormat(_Message):
    encoding: str
    sampleRate: int
    channels: int = 1


class StartInfo(_Message):
    accountSid: str = ""
    streamSid: str
    callSid: str = ""
    tracks: list[str] = Field(default_factory=lambda: ["inbound"])
    customParameters: dict[str, str] = Field(default_factory=dict)
    mediaFormat: MediaFormat


class Start(_Message):
    event: Literal["start"]
    sequenceNumber: str = ""
    streamSid: str = ""
    start: StartInfo


class MediaInfo(_Message):
    track: str = "inbound"
    chunk: str = ""
    timestamp: str = ""
    payload: str

    def audio(self) -> bytes:
        """The payload's mu-law bytes."""
        try:
            return base64.b64decode(self.payload, validate=True)
        except (binascii.Error, ValueError):
            raise TwilioMessageError("media.payload is not base64.") from None


class Media(_Message):
    event: Literal["media"]
    sequenceNumber: str = ""
    streamSid: str = ""
    media: MediaInfo


class DtmfInfo(_Message):
    track: str = "inbound_track"
    digit: str


class Dtmf(_Message):
    event: Literal["dtmf"]
    sequenceNumber: str = ""
    streamSid: str = ""
    dtmf: DtmfInfo


class MarkInfo(_Message):
    name: str


class Mark(_Message):
    event: Literal["mark"]
    sequenceNumber: str = ""
    streamSid: str = ""
    mark: MarkInfo


class StopInfo(_Message):
    accountSid: str = ""
    callSid: str = ""


class Stop(_Message):
    event: Literal["stop"]
    sequenceNumber: str = ""
    streamSid: str = ""
    stop: StopInfo = Field(default_factory=StopInfo)


Inbound = Annotated[Connected | Start | Media | Dtmf | Mark | Stop, Field(discriminator="event")]
_INBOUND: TypeAdapter[Inbound] = TypeAdapter(Inbound)  # type: ignore[arg-type]  # an Annotated union
EVENTS = ("connected", "start", "media", "dtmf", "mark", "stop")


def parse(raw: str | bytes) -> Inbound | None:
    """One message from Twilio; None for an event this server does not know (Twilio may add some)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise TwilioMessageError("The message is not JSON.") from None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise TwilioMessageError("The message is not an object with an 'event'.")
    if data["event"] not in EVENTS:
        return None
    try:
        return _INBOUND.validate_python(data)
    except ValidationError as exc:
        where = ", ".join(".".join(str(part) for part in error["loc"][1:]) or "event" for error in exc.errors())
        raise TwilioMessageError(f"The '{data['event']}' message is malformed at {where}.") from None


def media(stream_sid: str, mulaw: bytes) -> str:
    return json.dumps({"event": "media", "streamSid": stream_sid,
                       "media": {"payload": base64.b64encode(mulaw).decode("ascii")}})


def mark(stream_sid: str, name: str) -> str:
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    return json.dumps({"event": "clear", "streamSid": stream_sid})
