"""What the Responses API sends, built in one place with the openai SDK's own types: the response object,
its output items, the stream's events (numbered by `sequence_number`), and the input items as
`/v1/responses/{id}/input_items` lists them. Serialized as the SDK does (`to_dict`: the fields set, by
their API names), so what goes out is what the SDK parses and nothing it does not declare."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from openai import BaseModel
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseRefusalDeltaEvent,
    ResponseRefusalDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from gateway.protocol.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    JsonSchemaFormat,
    MessageItem,
    RefusalPart,
    ResponseCreateRequest,
)

Status = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
IncompleteReason = Literal["max_output_tokens", "content_filter"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def wire(model: BaseModel) -> dict[str, Any]:
    return model.to_dict(mode="json")


def sse_event(event: BaseModel) -> bytes:
    """One server-sent event, named by its type as OpenAI's stream names them."""
    payload = wire(event)
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def input_items(request: ResponseCreateRequest) -> list[dict[str, Any]]:
    """The request's input as items with ids, as input_items lists them (and as they are stored)."""
    items = request.input if isinstance(request.input, list) else [MessageItem(role="user", content=request.input)]
    return [_input_item(item) for item in items]


def _input_item(item: MessageItem | FunctionCallItem | FunctionCallOutputItem) -> dict[str, Any]:
    status = item.status or "completed"
    if isinstance(item, FunctionCallItem):
        return {"id": item.id or new_id("fc"), "type": "function_call", "status": status, "call_id": item.call_id,
                "name": item.name, "arguments": item.arguments}
    if isinstance(item, FunctionCallOutputItem):
        return {"id": item.id or new_id("fco"), "type": "function_call_output", "status": status,
                "call_id": item.call_id, "output": item.text()}
    parts = [item.content] if isinstance(item.content, str) else item.content
    content: list[dict[str, Any]]
    if item.role == "assistant":
        content = [{"type": "refusal", "refusal": part.refusal} if isinstance(part, RefusalPart)
                   else {"type": "output_text", "text": part if isinstance(part, str) else part.text, "annotations": []}
                   for part in parts]
    else:
        content = [{"type": "input_text", "text": part if isinstance(part, str)
                    else (part.refusal if isinstance(part, RefusalPart) else part.text)} for part in parts]
    return {"id": item.id or new_id("msg"), "type": "message", "role": item.role, "status": status, "content": content}


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    cached_tokens: int
    output_tokens: int

    def wire(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens,
                                         "cache_write_tokens": self.input_tokens - self.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": 0}}


@dataclass
class ResponseState:
    """A response as it goes: what the request set, and what its run fills in."""

    request: ResponseCreateRequest
    max_output_tokens: int
    metadata: dict[str, str]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "in_progress"
    output: list[ResponseOutputMessage | ResponseFunctionToolCall] = field(default_factory=list)
    usage: Usage | None = None
    error: tuple[str, str] | None = None  # (code, message): a failed response's
    incomplete: IncompleteReason | None = None
    completed_at: int | None = None

    def object(self) -> Response:
        request = self.request
        text_format = request.text_format
        if isinstance(text_format, JsonSchemaFormat):
            format_wire: dict[str, Any] = {"type": "json_schema", "name": text_format.name, "schema": text_format.schema_,
                                           "strict": text_format.strict if text_format.strict is not None else True}
            if text_format.description is not None:
                format_wire["description"] = text_format.description
        else:
            format_wire = {"type": text_format.type}
        choice = request.tool_choice
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
            "model": request.model, "instructions": request.instructions,
            "output": [wire(item) for item in self.output],
            "error": {"code": self.error[0], "message": self.error[1]} if self.error else None,
            "incomplete_details": {"reason": self.incomplete} if self.incomplete else None,
            "tools": [{"type": "function", "name": tool.name, "description": tool.description,
                       "parameters": tool.parameters, "strict": tool.strict if tool.strict is not None else True}
                      for tool in request.tools or []],
            "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str) else (choice or "auto"),
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "max_output_tokens": request.max_output_tokens,
            "previous_response_id": request.previous_response_id,
            "conversation": {"id": request.conversation_id} if request.conversation_id else None,
            "text": {"format": format_wire, "verbosity": "medium"},
            "truncation": request.truncation or "disabled",
            "metadata": self.metadata,
            "usage": self.usage.wire() if self.usage else None,
            "background": False,
            "service_tier": "default",
            "reasoning": {"effort": None, "summary": None},
            "completed_at": self.completed_at,
        }
        for name in ("user", "safety_identifier", "prompt_cache_key"):
            if getattr(request, name) is not None:
                body[name] = getattr(request, name)
        return Response.model_validate(body)


class ResponsesApiEvents:
    """A response's output as it streams, and the events that say so, numbered in order. Text opens a message
    item (and its output_text part) at its first delta; a refusal is a part of that message after its text;
    each call is a function_call item of its own after it."""

    def __init__(self, state: ResponseState) -> None:
        self.state = state
        self._sequence = 0
        self._message: ResponseOutputMessage | None = None
        self._text: list[str] | None = None  # the open output_text part's
        self._parts: list[ResponseOutputText | ResponseOutputRefusal] = []  # the open message's finished parts

    def _n(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def created(self) -> list[BaseModel]:
        response = self.state.object()
        return [ResponseCreatedEvent(type="response.created", response=response, sequence_number=self._n()),
                ResponseInProgressEvent(type="response.in_progress", response=response, sequence_number=self._n())]

    def text(self, delta: str) -> list[BaseModel]:
        events = self._open_message() if self._message is None else []
        message = self._message
        assert message is not None
        if self._text is None:
            self._text = []
            part = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
            events.append(ResponseContentPartAddedEvent(type="response.content_part.added", item_id=message.id,
                                                        output_index=self._index(), content_index=len(self._parts),
                                                        part=part, sequence_number=self._n()))
        self._text.append(delta)
        return [*events, ResponseTextDeltaEvent(type="response.output_text.delta", item_id=message.id,
                                                output_index=self._index(), content_index=len(self._parts),
                                                delta=delta, logprobs=[], sequence_number=self._n())]

    def refusal(self, refusal: str) -> list[BaseModel]:
        """The policy stopped the reply: the message says why, in a refusal part after its text."""
        events = self._open_message() if self._message is None else self._close_text()
        message = self._message
        assert message is not None
        index, content_index = self._index(), len(self._parts)
        done = ResponseOutputRefusal(type="refusal", refusal=refusal)
        self._parts.append(done)
        return [*events,
                ResponseContentPartAddedEvent(type="response.content_part.added", item_id=message.id, output_index=index,
                                              content_index=content_index,
                                              part=ResponseOutputRefusal(type="refusal", refusal=""),
                                              sequence_number=self._n()),
                ResponseRefusalDeltaEvent(type="response.refusal.delta", item_id=message.id, output_index=index,
                                          content_index=content_index, delta=refusal, sequence_number=self._n()),
                ResponseRefusalDoneEvent(type="response.refusal.done", item_id=message.id, output_index=index,
                                         content_index=content_index, refusal=refusal, sequence_number=self._n()),
                ResponseContentPartDoneEvent(type="response.content_part.done", item_id=message.id, output_index=index,
                                             content_index=content_index, part=done, sequence_number=self._n())]

    def call(self, call_id: str, name: str, arguments: str) -> list[BaseModel]:
        """A function call, whole: its item, its arguments in one delta, and its end."""
        events = self.close_message("completed")
        index = len(self.state.output)
        item_id = new_id("fc")
        started = ResponseFunctionToolCall(type="function_call", id=item_id, call_id=call_id, name=name, arguments="",
                                           status="in_progress")
        done = ResponseFunctionToolCall(type="function_call", id=item_id, call_id=call_id, name=name,
                                        arguments=arguments, status="completed")
        self.state.output.append(done)
        return [*events,
                ResponseOutputItemAddedEvent(type="response.output_item.added", item=started, output_index=index,
                                             sequence_number=self._n()),
                ResponseFunctionCallArgumentsDeltaEvent(type="response.function_call_arguments.delta", item_id=item_id,
                                                        output_index=index, delta=arguments, sequence_number=self._n()),
                ResponseFunctionCallArgumentsDoneEvent(type="response.function_call_arguments.done", item_id=item_id,
                                                       output_index=index, arguments=arguments,
                                                       sequence_number=self._n()),
                ResponseOutputItemDoneEvent(type="response.output_item.done", item=done, output_index=index,
                                            sequence_number=self._n())]

    def close_message(self, status: Literal["completed", "incomplete"], *, keep_text: bool = True) -> list[BaseModel]:
        """The open message's end (none open: nothing). `keep_text` False leaves its text out of the item (a reply
        the classifier withheld whole, JSON cut short): what streamed already was sent."""
        message = self._message
        if message is None:
            return []
        events = self._close_text()
        index = self._index()
        self._message = None
        parts = self._parts if keep_text else [part for part in self._parts if isinstance(part, ResponseOutputRefusal)]
        self._parts = []
        done = ResponseOutputMessage(type="message", id=message.id, role="assistant", status=status, content=parts)
        self.state.output[index] = done
        return [*events, ResponseOutputItemDoneEvent(type="response.output_item.done", item=done, output_index=index,
                                                     sequence_number=self._n())]

    def _close_text(self) -> list[BaseModel]:
        if self._text is None or self._message is None:
            return []
        text, self._text = "".join(self._text), None
        part = ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=[])
        index, content_index = self._index(), len(self._parts)
        self._parts.append(part)
        return [ResponseTextDoneEvent(type="response.output_text.done", item_id=self._message.id, output_index=index,
                                      content_index=content_index, text=text, logprobs=[], sequence_number=self._n()),
                ResponseContentPartDoneEvent(type="response.content_part.done", item_id=self._message.id,
                                             output_index=index, content_index=content_index, part=part,
                                             sequence_number=self._n())]

    def finished(self) -> list[BaseModel]:
        """The terminal event of the response as it ended (completed, incomplete or failed)."""
        response = self.state.object()
        if self.state.status == "failed":
            return [ResponseFailedEvent(type="response.failed", response=response, sequence_number=self._n())]
        if self.state.status == "incomplete":
            return [ResponseIncompleteEvent(type="response.incomplete", response=response, sequence_number=self._n())]
        return [ResponseCompletedEvent(type="response.completed", response=response, sequence_number=self._n())]

    def error(self, code: str, message: str, param: str | None = None) -> list[BaseModel]:
        return [ResponseErrorEvent(type="error", code=code, message=message, param=param, sequence_number=self._n())]

    def _open_message(self) -> list[BaseModel]:
        index = len(self.state.output)
        message = ResponseOutputMessage(type="message", id=new_id("msg"), role="assistant", status="in_progress",
                                        content=[])
        self._message = message
        self.state.output.append(message)
        return [ResponseOutputItemAddedEvent(type="response.output_item.added", item=message, output_index=index,
                                             sequence_number=self._n())]

    def _index(self) -> int:
        assert self._message is not None
        return self.state.output.index(self._message)
