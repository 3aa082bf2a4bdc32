"""The contract: every server event and response validates against the official `openai` SDK's own
pydantic types, which is what clients built on them (the SDK, openai-agents, frameworks' OpenAI
Realtime services) parse. The test clients check each event they receive here."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

from openai import BaseModel
from openai.types.live import ServerEvent as LiveServerEvent
from openai.types.realtime import RealtimeServerEvent
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError


def _event_types(events: Any) -> dict[str, type[BaseModel]]:
    """The SDK's class for each event type of a union (its members, keyed by their `type` literal)."""
    union = typing.get_args(events)[0]  # Annotated[Union[...], discriminator]
    return {typing.get_args(model.model_fields["type"].annotation)[0]: model for model in typing.get_args(union)}


SERVER_EVENT_TYPES = _event_types(RealtimeServerEvent)
LIVE_EVENT_TYPES = _event_types(LiveServerEvent)
RESPONSE_EVENT_TYPES = _event_types(ResponseStreamEvent)

# Our documented additions (docs/realtime.md, "Our additions"), and what OpenAI's own server sends beyond the SDK's
# session type (its id, object and expiry); the SDK's types allow extra fields and clients ignore them.
ADDITIONS = {"sequence_number", "text@conversation.item.input_audio_transcription.delta", "resume_token@session.created",
             "session.id", "session.object", "session.expires_at"}


def _extra_fields(value: Any, path: str) -> list[str]:
    """Every field the SDK's type does not declare, however deep: a field not in the contract is one
    that clients cannot rely on, or one they may send back and have refused."""
    if isinstance(value, BaseModel):
        found = [f"{path}.{key}" for key in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += _extra_fields(getattr(value, name), f"{path}.{name}")
        return found
    if isinstance(value, list):
        return [extra for item in value for extra in _extra_fields(item, f"{path}[]")]
    if isinstance(value, dict):
        return [extra for key, item in value.items() for extra in _extra_fields(item, f"{path}.{key}")]
    return []


def _assert_declared(event: dict[str, Any], types: dict[str, type[BaseModel]], contract: str,
                     allowed: Callable[[str, str], bool]) -> None:
    """The event validates against its type in `types`, and every field it has is declared there (or `allowed`)."""
    wire = {key: value for key, value in event.items() if not key.startswith("_")}  # "_" keys: the test client's notes
    model = types.get(wire.get("type"))
    if model is None:
        raise AssertionError(f"{wire.get('type')!r} is not a server event type of {contract}: {wire}")
    try:
        parsed = model.model_validate(wire)
    except ValidationError as exc:
        raise AssertionError(f"{wire.get('type')} does not validate against {contract}:\n{exc}\n{wire}") from None
    extras = [path for path in (extra[1:] for extra in _extra_fields(parsed, "")) if not allowed(path, wire["type"])]
    if extras:
        raise AssertionError(f"{wire['type']} has fields {contract} does not declare: {extras}\n{wire}")


def assert_valid_server_event(event: dict[str, Any]) -> None:
    _assert_declared(event, SERVER_EVENT_TYPES, "the openai SDK's Realtime types",
                     lambda path, kind: path in ADDITIONS or f"{path}@{kind}" in ADDITIONS)


def assert_valid_live_event(event: dict[str, Any]) -> None:
    """A GPT-Live server event, against openai.types.live: every field declared there, and nothing else."""
    _assert_declared(event, LIVE_EVENT_TYPES, "openai.types.live", lambda path, kind: False)


# -- POST /v1/audio/speech with stream_format "sse" -------------------------------------------------------
# The openai SDK (3.57) sends stream_format "sse" but declares no type for the events that come back: these
# are OpenAI's own, as its API reference (the OpenAPI document's SpeechAudioDeltaEvent and
# SpeechAudioDoneEvent) has them, every field required, on the SDK's BaseModel.


class SpeechAudioDeltaEvent(BaseModel):
    type: Literal["speech.audio.delta"]
    audio: str  # a chunk of the audio in the requested response_format, base64


class SpeechUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDoneEvent(BaseModel):
    type: Literal["speech.audio.done"]
    usage: SpeechUsage


SpeechStreamEvent = SpeechAudioDeltaEvent | SpeechAudioDoneEvent


def assert_valid_speech_event(event: dict[str, Any]) -> SpeechStreamEvent:
    """One SSE event of a speech stream, checked strictly (JSON's types as they are) and with no field that
    OpenAI's type does not declare."""
    model = {"speech.audio.delta": SpeechAudioDeltaEvent, "speech.audio.done": SpeechAudioDoneEvent}.get(event.get("type"))
    if model is None:
        raise AssertionError(f"{event.get('type')!r} is not a speech stream event: {event}")
    try:
        parsed = model.model_validate(event, strict=True)
    except ValidationError as exc:
        raise AssertionError(f"{event['type']} does not validate as OpenAI's {model.__name__}:\n{exc}\n{event}") from None
    if extras := _extra_fields(parsed, ""):
        raise AssertionError(f"{event['type']} has fields OpenAI's {model.__name__} does not declare: {extras}\n{event}")
    return parsed


def assert_valid_conversations_object(model: Any, value: dict[str, Any]) -> None:
    """`value` as the public Conversations API's `model` (`openai.types.conversations`: Conversation,
    ConversationDeletedResource, ConversationItemList, or the ConversationItem union), with no field the
    SDK's types do not declare. An empty list's first_id and last_id are null (the SDK's page reads them so)."""
    from pydantic import TypeAdapter

    if getattr(model, "__name__", "") == "ConversationItemList" and not value["data"]:
        value = {**value, "first_id": value["first_id"] or "", "last_id": value["last_id"] or ""}
    try:
        parsed = TypeAdapter(model).validate_python(value)
    except ValidationError as exc:
        raise AssertionError(f"{value} does not validate against the openai SDK's {model}:\n{exc}") from None
    if extras := [extra[1:] for extra in _extra_fields(parsed, "")]:
        raise AssertionError(f"{value} has fields the openai SDK's types do not declare: {extras}")


def _wire(value: dict[str, Any] | BaseModel) -> dict[str, Any]:
    """As it came over the wire: the SDK's parsed objects keep the fields they do not declare (model_extra)."""
    return value.to_dict(mode="json") if isinstance(value, BaseModel) else value


def _strictly(model: Any, value: dict[str, Any] | BaseModel, what: str) -> None:
    wire = _wire(value)
    try:
        parsed = TypeAdapter(model).validate_python(wire)
    except ValidationError as exc:
        raise AssertionError(f"{what} does not validate against the openai SDK's types:\n{exc}\n{wire}") from None
    extras = [extra[1:] for extra in _extra_fields(parsed, "")]
    if extras:
        raise AssertionError(f"{what} has fields the openai SDK's types do not declare: {extras}\n{wire}")


def assert_valid_response(response: dict[str, Any] | BaseModel) -> None:
    """A Responses API response object (its output items, usage, ... too)."""
    _strictly(Response, response, "the response")


def assert_valid_response_item(item: dict[str, Any] | BaseModel) -> None:
    """An item as /v1/responses/{id}/input_items lists it."""
    _strictly(ResponseItem, item, f"the item {_wire(item).get('type')}")


def assert_valid_response_event(event: dict[str, Any] | BaseModel) -> None:
    """A Responses API stream event."""
    wire = _wire(event)
    model = RESPONSE_EVENT_TYPES.get(wire.get("type"))
    if model is None:
        raise AssertionError(f"{wire.get('type')!r} is not a Responses stream event type of the openai SDK: {wire}")
    _strictly(model, wire, str(wire["type"]))
