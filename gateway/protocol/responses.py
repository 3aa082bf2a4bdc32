"""The Responses API's request (POST /v1/responses), strict as chat's: an unknown field, a value of the wrong
type or a field this gateway does not serve is refused by name, never ignored.

`parse_response_request` first refuses, by name and with what is served instead, the parts of OpenAI's API
that this gateway does not serve (hosted tools, background responses, reasoning effort, prompt templates, ...),
then validates the rest against `ResponseCreateRequest`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from gateway.protocol.chat import INT32_MAX, MEMORY_TOOL_NAME
from gateway.protocol.errors import ApiError, invalid_value
from gateway.protocol.validation import Temperature, api_error_from_validation

FORBID = ConfigDict(extra="forbid", strict=True)
ItemStatus = Literal["in_progress", "completed", "incomplete"]
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits


class InputText(BaseModel):
    model_config = FORBID
    type: Literal["input_text"]
    text: str


class OutputText(BaseModel):
    """An assistant message's text as a response returned it (sent back as input)."""

    model_config = FORBID
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)  # none are made here; a client's are kept out of the prompt
    logprobs: list[dict[str, Any]] | None = None


class RefusalPart(BaseModel):
    model_config = FORBID
    type: Literal["refusal"]
    refusal: str


def _type_of(served: str, default: str | None = None) -> Discriminator:
    """Unions told apart by `type`. Their tags are capitalised, as class names are, so that a refusal's
    `param` leaves them out (api_error_from_validation) and names the fields only."""

    def kind(value: Any) -> str | None:
        found = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return "".join(word.capitalize() for word in found.split("_")) if isinstance(found, str) else None

    return Discriminator(kind, custom_error_type="invalid_type", custom_error_message=f"the type is one of {served}")


# A string, or a list (of parts, of items): told apart by the value's type.
TEXT_OR_LIST = Discriminator(lambda value: "Text" if isinstance(value, str) else "Items")


ContentPart = Annotated[Annotated[InputText, Tag("InputText")] | Annotated[OutputText, Tag("OutputText")]
                        | Annotated[RefusalPart, Tag("Refusal")], _type_of("input_text, output_text, refusal")]
Content = Annotated[Annotated[str, Tag("Text")] | Annotated[list[ContentPart], Tag("Items")], TEXT_OR_LIST]
Output = Annotated[Annotated[str, Tag("Text")] | Annotated[list[InputText], Tag("Items")], TEXT_OR_LIST]


class MessageItem(BaseModel):
    model_config = FORBID
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.refusal if isinstance(part, RefusalPart) else part.text for part in self.content)

    @model_validator(mode="after")
    def _has_text(self) -> MessageItem:
        if not self.text().strip():  # as chat's messages: a prompt of nothing is no question
            raise ValueError(f"{self.role} message has empty content")
        return self


class FunctionCallItem(BaseModel):
    model_config = FORBID
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = FORBID
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=128)
    output: Output
    id: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")] | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
    _type_of("message, function_call, function_call_output", "message"),
]
Input = Annotated[Annotated[str, Tag("Text")] | Annotated[list[InputItem], Tag("Items")], TEXT_OR_LIST]


class FunctionTool(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; a forced call's arguments are decoded under it
    strict: bool | None = None  # a forced call always follows the schema (grammar-constrained), as in chat


class FunctionChoice(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = FORBID
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = FORBID
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = FORBID
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # always enforced: the output is decoded under the schema's grammar


class TextConfig(BaseModel):
    model_config = FORBID
    format: Annotated[Annotated[TextFormat, Tag("Text")] | Annotated[JsonObjectFormat, Tag("JsonObject")]
                      | Annotated[JsonSchemaFormat, Tag("JsonSchema")], _type_of("text, json_object, json_schema")] = Field(
        default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["medium"] | None = None  # the model's own: "low" and "high" are refused


class ConversationRef(BaseModel):
    model_config = FORBID
    id: str = Field(min_length=1, max_length=64)


class StreamOptions(BaseModel):
    model_config = FORBID
    include_obfuscation: Literal[False] = False  # no obfuscation field is added to the deltas


class ReasoningConfig(BaseModel):
    model_config = FORBID
    effort: Literal["none"] | None = None  # the model does not reason: only "none"
    summary: None = None


class ResponseCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    model: str
    input: Input = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=64)
    conversation: str | ConversationRef | None = None
    store: bool | None = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: Temperature | None = None
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    background: Literal[False] | None = None
    include: list[str] | None = Field(None, max_length=0)  # no includable is produced here
    prompt_cache_key: str | None = Field(None, max_length=256)  # routes the request as a conversation's, for the prefix cache
    prompt_cache_retention: Literal["in_memory"] | None = None
    service_tier: Literal["auto", "default"] | None = None
    top_logprobs: Literal[0] | None = None
    user: str | None = Field(None, max_length=256)  # echoed in the response; changes nothing
    safety_identifier: str | None = Field(None, max_length=256)  # echoed in the response; changes nothing

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise ValueError(f"keys of at most {MAX_METADATA_KEY} characters, values of at most {MAX_METADATA_VALUE}")
        return metadata

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    @property
    def text_format(self) -> TextFormat | JsonObjectFormat | JsonSchemaFormat:
        return self.text.format if self.text is not None else TextFormat(type="text")


_HOSTED_TOOLS = "function tools only (hosted tools such as web_search, file_search or code_interpreter are not served)"
# Top-level fields of OpenAI's API that are not served, refused whatever their value but null; and those
# served in some values only (see the model's fields).
_UNSERVED = {
    "prompt": "prompt templates are not served",
    "max_tool_calls": "there are no built-in tools to bound",
    "prompt_cache_options": "the prefix cache is automatic: it takes no options",
    "context_management": "context compaction is not served (truncation 'auto' drops the oldest items)",
    "moderation": "the gateway's own safety policy applies (see docs/safety.md)",
    "image": "images are not served",
    "access_programs": "access programs are not served",
    "background_options": "background responses are not served",
}
_UNSERVED_VALUES = {
    "background": (False, "background responses are not served: stream the response instead"),
    "include": ([], "none of the includable fields is produced"),
    "reasoning": ({"effort": "none"}, "the model does not reason: only effort 'none'"),
    "prompt_cache_retention": ("in_memory", "the prefix cache is in memory"),
    "top_logprobs": (0, "log probabilities are not served"),
}
_UNSERVED_PARTS = {"input_image": "images", "input_file": "files", "input_audio": "audio (use the Realtime API)"}


def _unserved(param: str, why: str) -> ApiError:
    return ApiError("unsupported_parameter", f"'{param}' is not served by this gateway: {why}.", param)


def _refuse_unserved(payload: dict[str, Any]) -> None:
    for name, why in _UNSERVED.items():
        if payload.get(name) is not None:
            raise _unserved(name, why)
    for name, (served, why) in _UNSERVED_VALUES.items():
        value = payload.get(name)
        if name == "reasoning" and isinstance(value, dict):
            value = {key: item for key, item in value.items() if item is not None} or served
        if value is not None and value != served:
            raise _unserved(name, why)
    tools = payload.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and tool.get("type") != "function":
            raise _unserved(f"tools[{index}].type", f"'{tool.get('type')}' tools: {_HOSTED_TOOLS}")
    choice = payload.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise _unserved("tool_choice.type", f"'{choice.get('type')}': {_HOSTED_TOOLS}")
    items = payload.get("input")
    for index, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind not in ("message", "function_call", "function_call_output"):
            raise _unserved(f"input[{index}].type", f"'{kind}' items: messages, function_call and "
                            "function_call_output items are served")
        parts = item.get("content") if kind == "message" else item.get("output")
        for number, part in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(part, dict) and part.get("type") in _UNSERVED_PARTS:
                field = "content" if kind == "message" else "output"
                raise _unserved(f"input[{index}].{field}[{number}].type", f"{_UNSERVED_PARTS[part['type']]} are not served: text only")
    verbosity = (payload.get("text") or {}).get("verbosity") if isinstance(payload.get("text"), dict) else None
    if verbosity not in (None, "medium"):
        raise _unserved("text.verbosity", "the model's verbosity is its own ('medium')")
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_obfuscation"):
        raise _unserved("stream_options.include_obfuscation", "no obfuscation is added to the deltas")
    if payload.get("service_tier") not in (None, "auto", "default"):
        raise _unserved("service_tier", "one tier, 'default'")


def parse_response_request(payload: dict[str, Any]) -> ResponseCreateRequest:
    _refuse_unserved(payload)
    try:
        request = ResponseCreateRequest.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
    if request.previous_response_id is not None and request.conversation is not None:
        raise invalid_value("'previous_response_id' and 'conversation' cannot be used together.", "conversation")
    names = {tool.name for tool in request.tools or []}
    if request.tool_choice == "required" and not names:
        raise invalid_value("tool_choice 'required' needs 'tools'.", "tool_choice")
    if isinstance(request.tool_choice, FunctionChoice) and request.tool_choice.name not in names | {MEMORY_TOOL_NAME}:
        raise invalid_value(f"tool_choice names '{request.tool_choice.name}', which is not in 'tools'.", "tool_choice.name")
    if isinstance(request.input, str) and not request.input.strip():
        raise invalid_value("'input' is empty (to go on without new input, give none).", "input")
    if not request.input and request.previous_response_id is None and request.conversation is None:
        raise invalid_value("'input' is empty.", "input")
    return request

