"""POST /v1/live/sessions: a GPT-Live session over WebRTC, as openai.types.live's LiveCreateParams declares it.

No I/O: the request's body in, the session's configuration, the data channel's permissions and the SDP offer out,
or an ApiError. The session is configured as over the WebSocket (session.start's rules: live_events.py), less
`audio.format` (the media transport negotiates it) and with what only a media session has: `client`, the
capabilities of an untrusted front end on the data channel, and the wake policy. Pausing an idle session
(`idle_timeout_s`) is refused by name; without it, the wake policy never applies (inference never pauses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.protocol.errors import ApiError
from gateway.protocol.json_input import decode_json
from gateway.protocol.live_events import REFUSED_TYPES, SERVED_TYPES, LiveSessionConfig, SessionStart, decode_live_event
from gateway.protocol.validation import api_error_from_validation

MAX_SDP_CHARS = 64 * 1024
LIVE_CLIENT_EVENT_TYPES = SERVED_TYPES | frozenset(REFUSED_TYPES)
# openai.types.live's server events (ServerEvent and the sideband's ConnectServerEvent): what a front end's data
# channel may be allowed to receive.
LIVE_SERVER_EVENT_TYPES = frozenset({
    "decision.event", "decision.item.created", "decision.item.deleted", "error", "info", "response.event",
    "session.closed", "session.commentary.appended", "session.delegation.created", "session.input_audio.append",
    "session.input_audio.muted", "session.input_audio.unmuted", "session.input_transcript.delta",
    "session.instructions.appended", "session.output_audio.delta", "session.output_audio.fixture.played",
    "session.output_audio.fixture.playing", "session.output_transcript.delta", "session.paused", "session.resumed",
    "session.started", "session.thinking.appended", "session.updated", "session.usage.updated", "transport.answered",
    "transport.dtmf.received", "transport.dtmf.send", "transport.dtmf.sent", "transport.failed", "transport.ringing",
})
RESPONSE_EVENT = "response.event"  # a delegated Responses stream's event, selected by its nested type


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerEventSelector(_Strict):
    type: str
    response_event: str | None = None

    @model_validator(mode="after")
    def _known(self) -> ServerEventSelector:
        if self.type not in LIVE_SERVER_EVENT_TYPES:
            raise ValueError(f"'{self.type[:100]}' is not a Live server event type")
        if (self.type == RESPONSE_EVENT) != (self.response_event is not None):
            raise ValueError("'response_event' is required with type 'response.event' and forbidden otherwise")
        return self


class DataChannelConfig(_Strict):
    allowed_client_events: list[str] | Literal["all"] | None = None  # the list first: its errors are reported
    allowed_server_events: list[ServerEventSelector] | Literal["all"] | None = None

    @model_validator(mode="after")
    def _known(self) -> DataChannelConfig:
        if isinstance(self.allowed_client_events, list):
            unknown = [kind for kind in self.allowed_client_events if kind not in LIVE_CLIENT_EVENT_TYPES]
            if unknown:
                raise ValueError(f"'{unknown[0][:100]}' is not a Live client event type")
        return self


class ClientConfig(_Strict):
    data_channel: DataChannelConfig


class WakePolicy(_Strict):
    type: Literal["speech"]
    vad_threshold: float = Field(0.5, ge=0.0, le=1.0)


class _MediaOnly(BaseModel):
    """The fields a media session has beyond session.start's (the others are checked as session.start's)."""

    client: ClientConfig | None = None
    idle_timeout_s: int | None = None
    wake_policy: WakePolicy | None = None


class _MediaFields(BaseModel):
    session: _MediaOnly


class WebRtcTransport(_Strict):
    type: Literal["webrtc"]
    sdp: str = Field(max_length=MAX_SDP_CHARS)


class _CreateBody(_Strict):
    session: dict[str, Any]
    transport: WebRtcTransport


@dataclass(frozen=True)
class DataChannelPermissions:
    """What an untrusted front end's data channel may send and be sent; None: everything (a sideband is never
    restricted)."""

    client_events: frozenset[str] | None = None
    server_events: frozenset[tuple[str, str | None]] | None = None  # (type, a response.event's nested type)

    @classmethod
    def of(cls, config: ClientConfig | None) -> DataChannelPermissions:
        channel = config.data_channel if config is not None else DataChannelConfig()
        client, server = channel.allowed_client_events, channel.allowed_server_events
        return cls(None if client is None or client == "all" else frozenset(client),
                   None if server is None or server == "all"
                   else frozenset((selector.type, selector.response_event) for selector in server))

    @property
    def restricted(self) -> bool:
        return self.client_events is not None or self.server_events is not None

    def allows_client(self, kind: str) -> bool:
        return self.client_events is None or kind in self.client_events

    def allows_server(self, event: dict[str, Any]) -> bool:
        if self.server_events is None:
            return True
        kind = event.get("type")
        nested = event.get("event")
        selector = nested.get("type") if kind == RESPONSE_EVENT and isinstance(nested, dict) else None
        return (kind, selector) in self.server_events

    def describe(self) -> str:
        """The `info` event's message: what this data channel may send and receive."""
        def listed(kinds: list[str] | None, what: str) -> str:
            if kinds is None:
                return f"every {what} event"
            return ", ".join(sorted(kinds)) if kinds else f"no {what} events"

        client = sorted(self.client_events) if self.client_events is not None else None
        server = (sorted(kind if nested is None else f"{kind}:{nested}" for kind, nested in self.server_events)
                  if self.server_events is not None else None)
        return (f"This data channel may send {listed(client, 'client')} and receives {listed(server, 'server')} "
                "(session.client.data_channel); a sideband connection is not restricted.")


@dataclass(frozen=True)
class LiveCreate:
    session: LiveSessionConfig  # with `client` as it was given (the session resource says it)
    permissions: DataChannelPermissions
    sdp: str


def peek_event(raw: str | bytes, *, max_bytes: int) -> tuple[str | None, str | None]:
    """A client message's type and event_id, if it has them, to decide who may send it before it is decoded
    (decode_live_event reports whatever is wrong with it)."""
    if len(raw) > max_bytes:
        return None, None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    kind, event_id = data.get("type"), data.get("event_id")
    return (kind if isinstance(kind, str) else None), (event_id if isinstance(event_id, str) else None)


def decode_live_create(raw: bytes, *, max_bytes: int) -> LiveCreate:
    """The body of POST /v1/live/sessions (JSON); an ApiError (400) names what is wrong."""
    data = decode_json(raw)
    if not isinstance(data, dict):
        raise ApiError("invalid_type", "The body must be a JSON object with 'session' and 'transport'.")
    try:
        body = _CreateBody.model_validate(data)
        media = _MediaFields.model_validate({"session": data["session"]}).session
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
    session = {key: value for key, value in body.session.items() if key not in _MediaOnly.model_fields}
    audio = session.get("audio")
    if isinstance(audio, dict) and "format" in audio:
        raise ApiError("unsupported_value", "WebRTC negotiates its audio format on the media transport; "
                       "'audio.format' is for a Live WebSocket.", "session.audio.format")
    if media.idle_timeout_s is not None:
        raise ApiError("unsupported_value", "Pausing an idle session is not served by this server; omit "
                       "'idle_timeout_s'.", "session.idle_timeout_s")
    # session.start's own checks, so that both transports refuse (and serve) the same configuration.
    start = decode_live_event(json.dumps({"type": "session.start", "session": session}), max_bytes=max_bytes)
    assert isinstance(start, SessionStart)
    config = start.session
    if media.client is not None:
        config = config.model_copy(update={"client": media.client.model_dump(exclude_none=True)})
    return LiveCreate(config, DataChannelPermissions.of(media.client), body.transport.sdp)


def decode_live_accept(raw: bytes, *, max_bytes: int) -> LiveSessionConfig:
    """The body of POST /v1/live/sessions/{id}/accept (`{"session": {"type": "live", ...}}`,
    client.live.sessions.accept): the Live session that answers a SIP call, configured as session.start's, less
    `audio.format` (the SDP negotiated G.711) and `client` (a SIP call has no front end)."""
    data = decode_json(raw)
    if not isinstance(data, dict) or not isinstance(data.get("session"), dict):
        raise ApiError("invalid_type", "The body must be a JSON object with a 'session' object.", "session")
    if set(data) != {"session"}:
        extra = sorted(set(data) - {"session"})[0]
        raise ApiError("unknown_parameter", f"Unknown parameter: '{extra[:100]}'.", extra[:100])
    session = dict(data["session"])
    kind = session.pop("type", None)
    if kind is None:
        raise ApiError("missing_required_parameter", "Missing required parameter: 'session.type' (live).",
                       "session.type")
    if kind != "live":
        raise ApiError("invalid_value", "session.type must be 'live' on /v1/live/sessions/{id}/accept.", "session.type")
    audio = session.get("audio")
    if isinstance(audio, dict) and "format" in audio:
        raise ApiError("unsupported_value", "A SIP call's audio format is negotiated in its SDP; omit "
                       "'audio.format'.", "session.audio.format")
    if "client" in session:
        raise ApiError("unsupported_value", "'client' capabilities are for a WebRTC front end; a SIP call has "
                       "none.", "session.client")
    start = decode_live_event(json.dumps({"type": "session.start", "session": session}), max_bytes=max_bytes)
    assert isinstance(start, SessionStart)
    return start.session
