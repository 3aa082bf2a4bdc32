"""Request bodies of the public Conversations API (/v1/conversations), as `openai.types.conversations` types
them: the input items a conversation can hold, and its metadata.

A conversation stores messages (text), function calls and their outputs. Every other item type of the
Responses API (images, files, reasoning, hosted tool calls) is refused by name, never dropped. An input
item's `id` and `status` are output fields that the SDK's types let a client send back (a response's output
as the next input): the stored item gets the gateway's own id and status.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag, ValidationError

from gateway.protocol.errors import ApiError
from gateway.protocol.validation import api_error_from_validation

MAX_ITEMS = 20  # per request, as OpenAI ("You may add up to 20 items at a time")
MAX_TEXT_CHARS = 100_000
STORABLE_ITEM_TYPES = ("message", "function_call", "function_call_output")

# OpenAI's metadata: 16 pairs at most, keys up to 64 characters, values up to 512.
Metadata = Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Annotated[str, StringConstraints(
    max_length=512)]], Field(max_length=16)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
ItemId = Annotated[str, StringConstraints(max_length=64)]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: Text


class OutputText(_Strict):
    type: Literal["output_text"]
    text: Text
    annotations: list[Any] = Field(default_factory=list, max_length=0, description="None are stored.")
    logprobs: list[Any] | None = Field(None, max_length=0, description="Not stored.")


ContentPart = Annotated[InputText | OutputText, Field(discriminator="type")]


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[ContentPart], Field(min_length=1, max_length=64)]
    id: ItemId | None = None
    status: ItemStatus | None = None

    def wire(self) -> dict[str, Any]:
        kind = "output_text" if self.role == "assistant" else "input_text"
        parts = ([{"type": kind, "text": self.content}] if isinstance(self.content, str)
                 else [{"type": part.type, "text": part.text} for part in self.content])
        return {"type": "message", "role": self.role, "content": parts}


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    arguments: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
    id: ItemId | None = None
    status: ItemStatus | None = None

    def wire(self) -> dict[str, Any]:
        return {"type": "function_call", "call_id": self.call_id, "name": self.name, "arguments": self.arguments}


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    output: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | Annotated[
        list[InputText], Field(min_length=1, max_length=64)]
    id: ItemId | None = None
    status: ItemStatus | None = None

    def wire(self) -> dict[str, Any]:
        output = self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)
        return {"type": "function_call_output", "call_id": self.call_id, "output": output}


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", "message")  # an "easy" message ({role, content}) has no type
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]
_UNION_TAGS = frozenset({*STORABLE_ITEM_TYPES, "constrained-str"})  # the tags pydantic puts in error locations
ModelT = TypeVar("ModelT", bound=BaseModel)


class CreateConversation(_Strict):
    items: list[InputItem] | None = Field(None, max_length=MAX_ITEMS,
                                          description=f"Initial items, up to {MAX_ITEMS}.")
    metadata: Metadata | None = None


class UpdateConversation(_Strict):
    metadata: Metadata | None = Field(description="Replaces the conversation's metadata; null clears it.")


class CreateItems(_Strict):
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS, description=f"Up to {MAX_ITEMS}.")


def _refuse_unstorable(payload: dict[str, Any]) -> None:
    """An item type the store cannot hold, refused by its name (pydantic would say only that the tag is wrong)."""
    items = payload.get("items")
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        kind = _item_type(item)
        if isinstance(kind, str) and kind not in STORABLE_ITEM_TYPES:
            raise ApiError("invalid_value", f"Items of type '{kind}' cannot be stored in a conversation; it holds "
                           f"{', '.join(STORABLE_ITEM_TYPES)} items.", f"items[{index}].type")
        content = item.get("content") if isinstance(item, dict) else None
        for number, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in ("input_text", "output_text"):
                raise ApiError("invalid_value", f"Content of type '{kind}' cannot be stored in a conversation; a "
                               "message holds input_text and output_text parts.",
                               f"items[{index}].content[{number}].type")


def parse_body(model: type[ModelT], payload: dict[str, Any]) -> ModelT:
    """The body as `model`: an unstorable item type, or a field that does not validate, is a 400 naming it."""
    _refuse_unstorable(payload)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc, union_tags=_UNION_TAGS) from None
