"""A Realtime conversation: ordered items, their wire form, truncation by heard audio. No I/O."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol.client_events import FunctionCallItem, FunctionCallOutputItem, ItemParam, MessageItem
from gateway.protocol.errors import ApiError, invalid_value, not_found
from gateway.safety.policy import SafetyPolicy
from gateway.safety.screening import screen_text
from inference.llm.chat import ChatMessage

ItemStatus = Literal["completed", "incomplete", "in_progress"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass
class SpokenSegment:
    """A piece of the assistant's text and where its audio sits in the item's audio stream."""

    text: str
    start_ms: float
    end_ms: float


@dataclass
class Item:
    id: str
    type: Literal["message", "function_call", "function_call_output"]
    status: ItemStatus = "completed"
    role: Literal["user", "assistant", "system"] | None = None
    # Message content parts in wire form: {"type": "input_text", "text": ...} etc.
    content: list[dict[str, Any]] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    # Assistant audio: the clauses spoken so far and the total audio sent, for exact truncation.
    spoken: list[SpokenSegment] = field(default_factory=list)
    audio_ms_sent: float = 0.0

    def text(self) -> str:
        """What the model should see of this item."""
        parts = []
        for part in self.content:
            value = part.get("text") if part.get("text") is not None else part.get("transcript")
            if value:
                parts.append(value)
        return " ".join(parts)

    def cut_audio(self, heard_ms: float) -> str:
        """Keep only the audio before `heard_ms` (clamped to what was sent); returns the text heard."""
        heard_ms = max(0.0, min(heard_ms, self.audio_ms_sent))
        text = heard_text(self.spoken, heard_ms)
        self.spoken = [segment for segment in self.spoken if segment.start_ms < heard_ms]
        self.audio_ms_sent = heard_ms
        return text

    def size_bytes(self) -> int:
        """The text it holds, UTF-8: what a conversation's byte bound counts."""
        texts = [part.get("text") or part.get("transcript") or "" for part in self.content]
        return sum(len(t.encode("utf-8", "surrogatepass")) for t in (*texts, self.arguments or "", self.output or ""))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "message":
            wire["role"] = self.role
            wire["content"] = [dict(part) for part in self.content]
        elif self.type == "function_call":
            wire.update(call_id=self.call_id, name=self.name, arguments=self.arguments)
        else:
            wire.update(call_id=self.call_id, output=self.output)
        return wire


def item_from_param(param: ItemParam) -> Item:
    item_id = param.id or new_id("item")
    if isinstance(param, MessageItem):
        content = []
        for part in param.content:
            if part.type in ("input_text", "text", "output_text"):
                if part.text is None:
                    raise ApiError("missing_required_parameter", "A text content part needs 'text'.", "item.content.text")
                kind = "output_text" if param.role == "assistant" else "input_text"
                content.append({"type": kind, "text": part.text})
            elif part.type in ("input_audio", "output_audio"):
                if part.transcript is None:
                    raise invalid_value(
                        "Audio content parts need a 'transcript' here; send audio with input_audio_buffer.append.",
                        "item.content.transcript",
                    )
                content.append({"type": part.type, "transcript": part.transcript})
        if not any((part.get("text") or part.get("transcript") or "").strip() for part in content):
            raise ApiError("empty_content", "The message has no text.", "item.content")
        return Item(id=item_id, type="message", role=param.role, content=content, status=param.status or "completed")
    if isinstance(param, FunctionCallItem):
        return Item(id=item_id, type="function_call", call_id=param.call_id, name=param.name, arguments=param.arguments)
    assert isinstance(param, FunctionCallOutputItem)
    return Item(id=item_id, type="function_call_output", call_id=param.call_id, output=param.output)


class Conversation:
    """Bounded: at most ``max_items`` items and ``max_bytes`` of their text (one client cannot hold the
    process's memory); an item over either bound is refused with ``conversation_full``."""

    def __init__(self, *, max_items: int, max_bytes: int, conversation_id: str | None = None) -> None:
        self.id = conversation_id or new_id("conv")
        self._items: list[Item] = []
        self.max_items, self.max_bytes = max_items, max_bytes

    @property
    def items(self) -> list[Item]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (None: at the end; "root": first). Returns the id before it."""
        if any(existing.id == item.id for existing in self._items):
            raise invalid_value(f"An item with id '{item.id}' already exists.", "item.id")
        if len(self._items) >= self.max_items:
            raise ApiError("conversation_full", f"The conversation holds its maximum of {self.max_items} items; "
                           "delete some (conversation.item.delete) to add more.", "item")
        held = sum(existing.size_bytes() for existing in self._items)
        if held + item.size_bytes() > self.max_bytes:
            raise ApiError("conversation_full", f"The item's {item.size_bytes()} bytes of text would take the "
                           f"conversation past its {self.max_bytes}-byte bound ({held} held); delete items to add "
                           "more.", "item")
        if previous_item_id is None:
            index = len(self._items)
        elif previous_item_id == "root":
            index = 0
        else:
            index = self._index(previous_item_id, param="previous_item_id") + 1
        self._items.insert(index, item)
        return self._items[index - 1].id if index > 0 else None

    def get(self, item_id: str) -> Item:
        return self._items[self._index(item_id)]

    def delete(self, item_id: str) -> Item:
        return self._items.pop(self._index(item_id))

    def _index(self, item_id: str, param: str = "item_id") -> int:
        for index, item in enumerate(self._items):
            if item.id == item_id:
                return index
        raise not_found("item_not_found", f"No item with id '{item_id}' in the conversation.", param) from None

    def truncate(self, item_id: str, content_index: int, audio_end_ms: float) -> Item:
        """Cut an assistant item to the audio actually heard; its transcript follows the cut.

        `audio_end_ms` past the audio sent so far is clamped (the client may have heard less than it
        thinks, never more); past the end of a finished item it is an error.
        """
        item = self.get(item_id)
        if item.type != "message" or item.role != "assistant":
            raise invalid_value("Only assistant messages can be truncated.", "item_id")
        if content_index >= len(item.content) or item.content[content_index]["type"] != "output_audio":
            raise invalid_value(f"Content part {content_index} of '{item_id}' is not audio.", "content_index")
        if item.status != "in_progress" and audio_end_ms > item.audio_ms_sent + 1:
            raise invalid_value(
                f"audio_end_ms {audio_end_ms} is past the item's audio ({item.audio_ms_sent:.0f} ms).", "audio_end_ms"
            )
        item.content[content_index]["transcript"] = item.cut_audio(audio_end_ms)
        item.status = "incomplete"
        return item

    def chat_messages(self, instructions: str, *, excluding: str | None = None) -> list[ChatMessage]:
        """The conversation as chat messages, without the item whose id is `excluding`."""
        messages = [ChatMessage("system", instructions)] if instructions else []
        for item in self._items:
            if item.id == excluding:
                continue
            if item.type == "message" and item.role is not None:
                text = item.text()
                if text:
                    messages.append(ChatMessage(item.role, text))
            elif item.type == "function_call":
                call = {"id": item.call_id, "function": {"name": item.name, "arguments": item.arguments}}
                messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
            elif item.type == "function_call_output":
                messages.append(ChatMessage("tool", item.output or "", tool_call_id=item.call_id))
        return messages


def heard_text(spoken: list[SpokenSegment], cut_ms: float) -> str:
    """The text whose audio ends before `cut_ms`; a clause cut midway keeps its words pro rata."""
    words: list[str] = []
    for segment in spoken:
        if segment.end_ms <= cut_ms:
            words.extend(segment.text.split())
        elif segment.start_ms < cut_ms:
            segment_words = segment.text.split()
            fraction = (cut_ms - segment.start_ms) / max(segment.end_ms - segment.start_ms, 1e-6)
            words.extend(segment_words[: int(len(segment_words) * fraction)])
    return " ".join(words)


def screen_item(policy: SafetyPolicy, item: Item) -> None:
    """A Realtime user message or function call output, screened in place before it joins the conversation."""
    if not policy:
        return
    if item.type == "function_call_output" and item.output:
        item.output = screen_text(policy, item.output, what="function call output", param="item.output")
    elif item.type == "message" and item.role == "user":
        for part in item.content:
            key = "text" if part.get("text") is not None else "transcript"
            if part.get(key):
                part[key] = screen_text(policy, part[key], what="user message", param=f"item.content.{key}")
