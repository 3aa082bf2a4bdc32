"""GPT-Live's client events (`/v1/live/sessions`), validated with pydantic as openai.types.live declares them.

No I/O: a message in, a validated event or an ApiError out. The session's configuration is strict (a misspelt
field is refused, never ignored), as Realtime's is. What this server does not serve is refused by name: the
Decisions API (`decision.*`, `triggers`, a `decisions` delegation), forks and stored sessions (`store: true`), and
custom voices. `transport.dtmf.send` is a SIP call's sideband's alone (decode_dtmf_send).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gateway.protocol.codec import event_envelope
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import MAX_INSTRUCTIONS_CHARS
from gateway.protocol.validation import api_error_from_validation

# "limited to 500 tokens" (openai.types.live): counted here as characters, four to a token.
MAX_APPENDED_CHARS = 2000
MAX_INITIAL_ITEMS = 128


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PcmFormat(_Strict):
    type: Literal["audio/pcm"]
    rate: Literal[16000, 24000] = 24000


class G711Format(_Strict):
    type: Literal["audio/pcmu", "audio/pcma"]
    rate: Literal[8000] = 8000


LiveAudioFormat = Annotated[PcmFormat | G711Format, Field(discriminator="type")]


class CustomVoice(_Strict):
    id: str


class LiveAudioOutput(_Strict):
    voice: str | CustomVoice | None = None


class LiveAudio(_Strict):
    format: LiveAudioFormat | None = None
    output: LiveAudioOutput | None = None


class InitialText(_Strict):
    text: str
    type: Literal["input_text", "text", "output_text"] | None = None


class InitialItem(_Strict):
    role: Literal["developer", "user", "assistant"]
    content: list[InitialText] = Field(min_length=1, max_length=1)
    id: str | None = Field(None, max_length=64)
    status: Literal["incomplete", "completed"] | None = None
    type: Literal["message"] | None = None


class ClientDelegation(_Strict):
    """Tasks the live model delegates go to the application (session.delegation.created)."""

    type: Literal["client"]
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


class ResponsesDelegation(_Strict):
    """Tasks go to the gateway's own Responses service, run with `responses` (a Responses request's fields: model,
    instructions, tools, tool_choice, max_output_tokens, parallel_tool_calls, ...: checked as one)."""

    type: Literal["responses"]
    responses: dict[str, Any]
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


class ResponsesDelegationUpdate(_Strict):
    type: Literal["responses"]
    responses: dict[str, Any] | None = None  # the fields to change; the others keep their values
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


Delegation = Annotated[ClientDelegation | ResponsesDelegation, Field(discriminator="type")]
DelegationUpdate = Annotated[ClientDelegation | ResponsesDelegationUpdate, Field(discriminator="type")]


class LiveSessionConfig(_Strict):
    """session.start's `session`: what a Live session is started with (voice and format are fixed from then)."""

    model: str = Field(max_length=256)
    audio: LiveAudio | None = None
    client: dict[str, Any] | None = None
    delegation: Delegation | None = None
    input: list[InitialItem] | None = Field(None, max_length=MAX_INITIAL_ITEMS)
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    safety_identifier: str | None = Field(None, max_length=512)
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None


class SessionUpdateConfig(_Strict):
    delegation: DelegationUpdate | None = None
    triggers: list[dict[str, Any]] | None = None


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str | None = Field(None, max_length=512)


class SessionStart(_Event):
    type: Literal["session.start"]
    session: LiveSessionConfig


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionUpdateConfig


class InputAudioAppend(_Event):
    type: Literal["session.input_audio.append"]
    audio: str


class InputAudioMute(_Event):
    type: Literal["session.input_audio.mute"]


class InputAudioUnmute(_Event):
    type: Literal["session.input_audio.unmute"]


class _Appended(_Event):
    content: str = Field(min_length=1, max_length=MAX_APPENDED_CHARS)
    delegation_id: str | None = None


class InstructionsAppend(_Appended):
    type: Literal["session.instructions.append"]


class ThinkingAppend(_Appended):
    type: Literal["session.thinking.append"]


class CommentaryAppend(_Appended):
    type: Literal["session.commentary.append"]


class SessionClose(_Event):
    type: Literal["session.close"]


class OutputAudioFixturePlay(_Event):
    """Play a recording through the session's output (raw PCM16 at 24 kHz, whatever the session's format)."""

    type: Literal["session.output_audio.fixture.play"]
    audio: str


class ResponseItemCreate(_Event):
    """An input item for the Responses delegation's next request (a user message, a function call's output)."""

    type: Literal["response.item.create"]
    item: dict[str, Any]


class ResponseCreate(_Event):
    """Run the Responses delegation on the items created since its last request."""

    type: Literal["response.create"]


LiveClientEvent = Annotated[
    SessionStart | SessionUpdate | InputAudioAppend | InputAudioMute | InputAudioUnmute | InstructionsAppend
    | ThinkingAppend | CommentaryAppend | SessionClose | ResponseItemCreate | ResponseCreate | OutputAudioFixturePlay,
    Field(discriminator="type"),
]
LIVE_CLIENT_EVENT_ADAPTER: TypeAdapter[LiveClientEvent] = TypeAdapter(LiveClientEvent)  # type: ignore[arg-type]  # an Annotated union
SERVED_TYPES = frozenset({
    "session.start", "session.update", "session.input_audio.append", "session.input_audio.mute",
    "session.input_audio.unmute", "session.instructions.append", "session.thinking.append",
    "session.commentary.append", "session.close", "response.item.create", "response.create",
    "session.output_audio.fixture.play",
})
# The protocol's other client events, and why this server refuses them.
REFUSED_TYPES = {
    "decision.create": "The Decisions API is not served by this server.",
    "decision.item.create": "The Decisions API is not served by this server.",
    "decision.item.delete": "The Decisions API is not served by this server.",
    "transport.dtmf.send": "transport.dtmf.send is for a SIP call's sideband (GET /v1/live/sessions/{id}/attach).",
    "session.fork.start": "Forks are not served by this server.",
}


class TransportDtmfSend(_Event):
    """One keypress to send the caller of a SIP call (RFC 4733), from a sideband."""

    type: Literal["transport.dtmf.send"]
    event: str = Field(pattern=r"^[0-9A-D*#]$")


def decode_dtmf_send(raw: str | bytes, *, max_bytes: int) -> TransportDtmfSend:
    data, _, event_id = event_envelope(raw, max_bytes=max_bytes)
    try:
        return TransportDtmfSend.model_validate(data)
    except ValidationError as exc:
        error = api_error_from_validation(exc)
        error.event_id = event_id
        raise error from None


def decode_live_event(raw: str | bytes, *, max_bytes: int) -> LiveClientEvent:
    """One Live WebSocket message; an ApiError (with the event's id when known) for anything refused."""
    data, event_type, event_id = event_envelope(raw, max_bytes=max_bytes)
    if event_type in REFUSED_TYPES:
        raise ApiError("unsupported_event", REFUSED_TYPES[event_type], "type", event_id=event_id)
    if event_type not in SERVED_TYPES:
        raise ApiError("unknown_event_type", f"Unknown event type '{event_type[:100]}'. Supported: "
                       f"{', '.join(sorted(SERVED_TYPES))}.", "type", event_id=event_id)
    session = data.get("session")
    delegation = session.get("delegation") if isinstance(session, dict) else None
    if isinstance(delegation, dict) and delegation.get("type") == "decisions":
        raise ApiError("unsupported_value", "The Decisions API is not served by this server.",
                       "session.delegation.type", event_id=event_id)
    try:
        event = LIVE_CLIENT_EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        error = api_error_from_validation(exc, union_tags=SERVED_TYPES | {"audio/pcm", "audio/pcmu", "audio/pcma", "client", "responses"})
        error.event_id = event_id
        raise error from None
    _refuse_unserved(event)
    return event


def _refuse_unserved(event: LiveClientEvent) -> None:
    """Fields the protocol has and this server does not serve: refused by name."""
    config: LiveSessionConfig | SessionUpdateConfig
    if isinstance(event, SessionStart):
        config = event.session
        if config.store:
            raise _unsupported(event, "Stored sessions (forks, recordings) are not served by this server.",
                               "session.store")
        if config.client is not None:
            raise _unsupported(event, "'client' capabilities are for a WebRTC front end; this is a WebSocket.",
                               "session.client")
        output = config.audio.output if config.audio is not None else None
        if output is not None and isinstance(output.voice, CustomVoice):
            raise _unsupported(event, "Custom voices are not served by this server.", "session.audio.output.voice")
    elif isinstance(event, SessionUpdate):
        config = event.session
    else:
        return
    if config.triggers:
        raise _unsupported(event, "Decisions triggers are not served by this server.", "session.triggers")


def _unsupported(event: LiveClientEvent, message: str, param: str) -> ApiError:
    return ApiError("unsupported_value", message, param, event_id=event.event_id)
