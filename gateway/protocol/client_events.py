"""Client -> server Realtime events (OpenAI GA names), validated with pydantic."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from gateway.protocol.session_config import (
    MAX_INSTRUCTIONS_CHARS,
    FunctionTool,
    OutputModality,
    ToolChoice,
    check_max_output_tokens,
)
from gateway.protocol.validation import Temperature


class _Event(BaseModel):
    # Unknown fields are tolerated on events (clients add their own), but not inside the session
    # object, where a typo silently ignored would be worse than an error.
    model_config = ConfigDict(extra="ignore")
    event_id: str | None = Field(None, max_length=512)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "text", "output_text", "input_audio", "output_audio"]
    text: str | None = None
    transcript: str | None = None
    audio: str | None = None


class _ItemBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class MessageItem(_ItemBase):
    type: Literal["message"]
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1)


class FunctionCallItem(_ItemBase):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""


class FunctionCallOutputItem(_ItemBase):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str


ItemParam = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]
ITEM_TYPES: frozenset[str] = frozenset(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(ItemParam)[0])
)


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: dict[str, Any]


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: ItemParam


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseParams(BaseModel):
    # An unknown field is refused with its name: ignored, it would be a setting that silently does nothing.
    model_config = ConfigDict(extra="forbid")
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    output_modalities: list[OutputModality] | None = Field(None, min_length=1, max_length=1)
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: Temperature | None = None
    conversation: Literal["auto", "none"] | str = "auto"
    input: list[ItemParam] | None = None
    metadata: dict[str, str] | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None  # checked against the tools the response uses (its own or the session's)

    @field_validator("max_output_tokens")
    @classmethod
    def _in_range(cls, value: int | str | None) -> int | str | None:
        return check_max_output_tokens(value)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams = Field(default_factory=ResponseParams)


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClear(_Event):
    type: Literal["output_audio_buffer.clear"]


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemDelete
    | ConversationItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear,
    Field(discriminator="type"),
]

CLIENT_EVENT_ADAPTER: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)  # type: ignore[arg-type]  # an Annotated union
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(ClientEvent)[0])
)
