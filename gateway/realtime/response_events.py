"""The event sequence of one Realtime response, as a pure state machine.

Each method returns the server events to send, in order, built with protocol/server_events.py's models
and given in wire form. `finish()` closes whatever was opened,
so a response cancelled at any point still ends with a well-formed tail and `response.done`.
A response's output is its assistant message (`item`, once opened) and the function calls it made,
each at the output index it was opened at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol import server_events as se
from gateway.protocol.server_events import Event
from gateway.realtime.conversation import Item

ResponseStatus = Literal["completed", "cancelled", "incomplete", "failed"]


@dataclass
class TokenUsage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "total_tokens": self.input_tokens + self.output_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "input_token_details": {"cached_tokens": self.cached_tokens, "text_tokens": self.input_tokens, "audio_tokens": 0},
            "output_token_details": {"text_tokens": self.output_tokens, "audio_tokens": 0},
        }


@dataclass
class ResponseEvents:
    response_id: str
    conversation_id: str | None
    item: Item
    audio: bool
    audio_format: dict[str, Any]
    voice: str
    max_output_tokens: int | str
    metadata: dict[str, str] | None = None
    status: Literal["in_progress"] | ResponseStatus = "in_progress"
    _opened: bool = False
    _text: list[str] = field(default_factory=list)
    _outputs: list[Item] = field(default_factory=list)  # in the order they were opened

    @property
    def opened(self) -> bool:
        """Whether the assistant message is in the output (a reply that only calls functions has none)."""
        return self._opened

    @property
    def content_kind(self) -> str:
        """The item's content type (GA names); `content_part` events name the same part `text` / `audio`."""
        return "output_audio" if self.audio else "output_text"

    @property
    def part_kind(self) -> str:
        return "audio" if self.audio else "text"

    def response_object(self, usage: TokenUsage | None = None, status_details: dict[str, Any] | None = None
                        ) -> se.RealtimeResponse:
        return se.RealtimeResponse(
            id=self.response_id,
            status=self.status,
            status_details=status_details,
            output=[item.to_wire() for item in self._outputs],
            conversation_id=self.conversation_id,
            output_modalities=["audio" if self.audio else "text"],
            max_output_tokens=self.max_output_tokens,
            audio={"output": {"format": self.audio_format, "voice": self.voice}},
            usage=usage.to_wire() if usage else None,
            metadata=self.metadata,
        )

    def _part(self) -> dict[str, Any]:
        """The ids of an event about the message's content part."""
        return {"response_id": self.response_id, "item_id": self.item.id, "output_index": self._index(self.item)}

    def _index(self, item: Item) -> int:
        return next(i for i, output in enumerate(self._outputs) if output is item)

    def created(self) -> list[Event]:
        return _wire(se.ResponseCreated(response=self.response_object()))

    def open_item(self, previous_item_id: str | None) -> list[Event]:
        """Called once the assistant item is in the conversation (it may stay out of it: conversation 'none')."""
        self._opened = True
        self._outputs.append(self.item)
        self.item.content = [{"type": self.content_kind, "transcript" if self.audio else "text": ""}]
        events: list[se.ServerEvent] = [
            se.OutputItemAdded(response_id=self.response_id, output_index=self._index(self.item),
                               item=self.item.to_wire())
        ]
        if self.conversation_id is not None:
            events.append(se.ItemAdded(previous_item_id=previous_item_id, item=self.item.to_wire()))
        part: dict[str, Any] = {"type": self.part_kind, "transcript" if self.audio else "text": ""}
        if self.audio:
            part["audio"] = None
        events.append(se.ContentPartAdded(**self._part(), part=part))
        return _wire(*events)

    def function_call(self, call: Item, previous_item_id: str | None) -> list[Event]:
        """A whole function call, as the model finished writing it (its arguments in one delta)."""
        assert call.type == "function_call" and call.arguments is not None
        assert call.call_id is not None and call.name is not None
        self._outputs.append(call)
        index = self._index(call)
        ids = {"response_id": self.response_id, "item_id": call.id, "output_index": index, "call_id": call.call_id}
        call.status = "in_progress"
        events: list[se.ServerEvent] = [
            se.OutputItemAdded(response_id=self.response_id, output_index=index, item=call.to_wire())]
        if self.conversation_id is not None:
            events.append(se.ItemAdded(previous_item_id=previous_item_id, item=call.to_wire()))
        events.append(se.FunctionCallArgumentsDelta(**ids, delta=call.arguments))
        events.append(se.FunctionCallArgumentsDone(**ids, name=call.name, arguments=call.arguments))
        call.status = "completed"
        events.append(se.OutputItemDone(response_id=self.response_id, output_index=index, item=call.to_wire()))
        if self.conversation_id is not None:
            events.append(se.ItemDone(previous_item_id=previous_item_id, item=call.to_wire()))
        return _wire(*events)

    def text_delta(self, delta: str) -> list[Event]:
        self._text.append(delta)
        self.item.content[0]["transcript" if self.audio else "text"] = "".join(self._text)
        if self.audio:
            return _wire(se.OutputAudioTranscriptDelta(**self._part(), delta=delta))
        return _wire(se.OutputTextDelta(**self._part(), delta=delta))

    def audio_delta(self, audio_b64: str) -> list[Event]:
        return _wire(se.OutputAudioDelta(**self._part(), delta=audio_b64))

    def finish(
        self,
        status: ResponseStatus,
        *,
        reason: str | None = None,
        usage: TokenUsage | None = None,
        error: dict[str, Any] | None = None,
        final_text: str | None = None,
    ) -> list[Event]:
        """Close the open parts, then `response.done`. `final_text` replaces the streamed text (truncation)."""
        if self.status != "in_progress":
            return []
        self.status = status
        events: list[se.ServerEvent] = []
        if self._opened:
            text_key = "transcript" if self.audio else "text"
            if final_text is not None:
                self.item.content[0][text_key] = final_text
            text = self.item.content[0][text_key]
            self.item.status = "completed" if status == "completed" else "incomplete"
            if self.audio:
                events.append(se.OutputAudioDone(**self._part()))
                events.append(se.OutputAudioTranscriptDone(**self._part(), transcript=text))
            else:
                events.append(se.OutputTextDone(**self._part(), text=text))
            events.append(se.ContentPartDone(**self._part(), part={"type": self.part_kind, text_key: text}))
            events.append(se.OutputItemDone(response_id=self.response_id, output_index=self._index(self.item),
                                            item=self.item.to_wire()))
            if self.conversation_id is not None:
                events.append(se.ItemDone(item=self.item.to_wire()))
        details: dict[str, Any] | None = None
        if status != "completed":
            details = {"type": status, "reason": reason}
            if error is not None:  # the GA shape: its type and code (the message goes in the `error` event)
                details["error"] = {"type": error.get("type"), "code": error.get("code")}
        events.append(se.ResponseDone(response=self.response_object(usage, details)))
        return _wire(*events)


def _wire(*events: se.ServerEvent) -> list[Event]:
    return [event.wire() for event in events]
