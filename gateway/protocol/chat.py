"""Chat Completions request model and response/chunk shapes (OpenAI's)."""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gateway.protocol.validation import Temperature
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage

INT32_MAX = 2**31 - 1  # counts of tokens: far past any context, never an overflow downstream
# Strict: `"stream": "yes"`, `"n": "1"` or `"temperature": true` are refused, not coerced.
STRICT = ConfigDict(strict=True)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as the model wrote it (OpenAI's shape: a string, not an object)


class ToolCallParam(BaseModel):
    """An assistant message's call, as a completion returned it (a streamed delta's `index` is ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: str
    type: Literal["function"]
    function: CalledFunction


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    @model_validator(mode="after")
    def _has_content(self) -> MessageParam:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool messages need 'tool_call_id'")
        if self.role == "assistant" and self.tool_calls:
            return self
        if not self.text().strip():
            raise ValueError(f"{self.role} message has empty content")
        return self

    def to_chat(self) -> ChatMessage:
        calls = tuple(call.model_dump() for call in self.tool_calls or ())
        return ChatMessage(self.role, self.text(), calls, self.tool_call_id)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; compiled into the grammar when a call is forced
    strict: bool | None = None  # forced calls always follow the schema (grammar-constrained)


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None  # always enforced: the output is decoded under the schema's grammar


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is given with type 'json_schema', and only then")
        return self


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The sampling parameters Chat Completions and (legacy) Completions share."""

    # An unknown parameter is refused by name: ignored, it would be one that silently does nothing.
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)  # not in OpenAI's API; accepted like vLLM does
    repetition_penalty: float | None = Field(None, ge=1.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI's
    n: int = Field(1, ge=1, le=1)
    user: str | None = None  # the end user's id, as OpenAI takes it: recorded nowhere, changes nothing
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4 or any(not stop for stop in stops):
            raise ValueError("up to 4 non-empty stop sequences")
        return stops

    def sampling(self, max_tokens: int, default_repetition_penalty: float, *, ignore_eos: bool = False) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=self.top_p or 1.0,
            top_k=self.top_k or 0,
            repetition_penalty=self.repetition_penalty or default_repetition_penalty,
            seed=self.seed,
            max_tokens=max_tokens,
            stop=tuple(self.stop or ()),
            ignore_eos=ignore_eos,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
        )


MEMORY_TOOL_NAME = "remember"  # the gateway's built-in memory tool (gateway/generation/memory.py), which tool_choice may name


class ChatCompletionRequest(SamplingRequest):
    messages: list[MessageParam] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    tools: list[ChatTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # Not in OpenAI's API: a stored conversation (/v1/conversations) whose current branch comes before
    # `messages`; those messages and the reply are stored under it.
    conversation: str | None = Field(None, min_length=1, max_length=64)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, choice: object, info: ValidationInfo) -> object:
        tools = info.data.get("tools") or []
        builtin = isinstance(choice, NamedToolChoice) and choice.function.name == MEMORY_TOOL_NAME
        if choice not in (None, "none", "auto") and not tools and not builtin:
            raise ValueError("tool_choice needs 'tools'")
        if (isinstance(choice, NamedToolChoice) and not builtin
                and choice.function.name not in {t.function.name for t in tools}):
            raise ValueError(f"tool_choice names '{choice.function.name}', which is not in 'tools'")
        return choice

    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def usage_object(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_object(
    cid: str, model: str, text: str | None, finish_reason: str, usage: dict[str, Any], fingerprint: str,
    *, tool_calls: list[dict[str, Any]] | None = None, refusal: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }


def chunk_object(
    cid: str,
    model: str,
    created: int,
    fingerprint: str,
    *,
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    chunk: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk
