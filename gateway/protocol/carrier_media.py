"""What every carrier's media stream comes to (Twilio Media Streams, Telnyx Media Streaming, Plivo Audio Streams):
one WebSocket a call, JSON text frames, base64 G.711 at 8 kHz both ways, and a named marker the carrier echoes once
the audio sent before it has played. Each carrier names the same things differently; its module (twilio_media.py,
telnyx_media.py, plivo_media.py) reads its own messages into the ones here and writes its own from them, so the
endpoint (gateway/api/transports/carrier_stream.py) knows no carrier's names.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

SAMPLE_RATE = 8000  # every carrier's stream here: G.711
Encoding = Literal["mulaw", "alaw"]
M = TypeVar("M", bound=BaseModel)


class CarrierMessageError(ValueError):
    """A message that is not the carrier's: its event and what is wrong with it (never its payload)."""


@dataclass(frozen=True)
class StreamStart:
    """The stream's first real message: who the call is and what its audio is."""

    stream_id: str
    call_id: str  # the carrier's own id of the call: the application finds the call's sideband by it
    encoding: str  # as the carrier wrote it; `codec` is what the gateway can take
    sample_rate: int
    channels: int
    codec: Encoding | None
    parameters: dict[str, str] = field(default_factory=dict)  # what the application passed with the stream


@dataclass(frozen=True)
class StreamAudio:
    g711: bytes  # the caller's audio, in the stream's codec


@dataclass(frozen=True)
class StreamDigit:
    digit: str


@dataclass(frozen=True)
class StreamPlayed:
    """The carrier played the audio sent before the marker `name`."""

    name: str


@dataclass(frozen=True)
class StreamStop:
    """The call ended on the carrier's side."""


@dataclass(frozen=True)
class StreamNotice:
    """A message that changes nothing here (`connected`, a confirmation of a clear), or a carrier's report of
    an error on its side (`error` set: its code, never its text, which may quote what was sent)."""

    event: str
    error: str | None = None


Inbound = StreamStart | StreamAudio | StreamDigit | StreamPlayed | StreamStop | StreamNotice


class CarrierWire(Protocol):
    """One carrier's messages: read into the ones above, and written from what the endpoint sends."""

    name: str
    encodings: str  # what `start` must announce, in the carrier's words, for a refusal to name

    def parse(self, raw: str | bytes, query: Mapping[str, str]) -> Inbound | None:
        """One message from the carrier (`query`: the stream URL's, where the carrier puts the application's
        parameters); None for an event this server does not know (carriers add some)."""

    def media(self, stream_id: str, g711: bytes) -> str: ...

    def mark(self, stream_id: str, name: str) -> str: ...

    def clear(self, stream_id: str) -> str: ...


class CarrierModel(BaseModel):
    """A carrier's message as this server reads it: fields carriers may add later are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class MediaInfo(CarrierModel):
    track: str = "inbound"  # with both tracks streamed, "outbound" is what the far end hears, not the caller
    payload: str


class Media(CarrierModel):
    """`media` as the three carriers send it."""

    media: MediaInfo


class DtmfInfo(CarrierModel):
    digit: str


class Dtmf(CarrierModel):
    dtmf: DtmfInfo


class MarkInfo(CarrierModel):
    name: str


class Mark(CarrierModel):
    """Twilio's and Telnyx's echo of a mark."""

    mark: MarkInfo


class MarkingWire:
    """What Twilio and Telnyx take alike, `media`, `mark` and `clear`, with the stream's id under `id_key`; and
    what they send alike (`media`, `dtmf`, `mark`, `stop`)."""

    id_key = "streamSid"

    def parse_common(self, data: dict[str, Any]) -> Inbound | None:
        match data["event"]:
            case "media":
                return caller_audio(data)
            case "dtmf":
                return StreamDigit(validated(Dtmf, data).dtmf.digit)
            case "mark":
                return StreamPlayed(validated(Mark, data).mark.name)
            case "stop":
                return StreamStop()
        return None

    def media(self, stream_id: str, g711: bytes) -> str:
        return json.dumps({"event": "media", self.id_key: stream_id, "media": {"payload": encode_payload(g711)}})

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "mark", self.id_key: stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clear", self.id_key: stream_id})


def caller_audio(data: dict[str, Any]) -> StreamAudio | StreamNotice:
    """A `media` message: the caller's audio, or a notice for the other track's."""
    media = validated(Media, data).media
    if media.track != "inbound":
        return StreamNotice("media")
    return StreamAudio(decode_payload(media.payload, "media.payload"))


def load_object(raw: str | bytes) -> dict[str, Any]:
    """The message as a JSON object with a string `event`."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CarrierMessageError("The message is not JSON.") from None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise CarrierMessageError("The message is not an object with an 'event'.")
    return data


def validated(model: type[M], data: dict[str, Any]) -> M:
    """`data` as the carrier's `model`, or a CarrierMessageError naming the fields that are wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where = ", ".join(".".join(str(part) for part in error["loc"]) or "event" for error in exc.errors())
        raise CarrierMessageError(f"The '{data['event']}' message is malformed at {where}.") from None


def decode_payload(payload: str, where: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise CarrierMessageError(f"{where} is not base64.") from None


def encode_payload(g711: bytes) -> str:
    return base64.b64encode(g711).decode("ascii")
