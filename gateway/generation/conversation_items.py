"""Stored messages as conversation items, and back: one mapping for every API that reads or writes a stored
conversation as items (Realtime sessions, /v1/conversations/{id}/items, /v1/responses with `conversation`).

An item is in Realtime's wire form without its `object`: a `message` (role, content parts such as
`input_text`, `output_text`, `input_audio` with its transcript), a `function_call` or a `function_call_output`.
A stored message is one row of the tree; an assistant row may hold text and several tool calls, so it reads
as several items: the message item has the row's id, each call `{row id}_{n}` (the first call the row's own id
when the row has no text). Realtime has no developer role: a developer message is a system item in the wire
form, and keeps its role in the public form (`public_item`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from gateway.platform.storage.conversations import MessageStatus, NewMessage
from gateway.platform.storage.schema import MessageRow

_STORED_PART = {"input_text": "text", "output_text": "text"}


@dataclass(frozen=True)
class StoredItem:
    wire: dict[str, Any]
    message_id: str  # the stored message it comes from
    role: str  # the stored message's


def items_from_rows(rows: list[MessageRow]) -> list[StoredItem]:
    """A stored branch, root first, as items."""
    items: list[StoredItem] = []
    for row in rows:
        if row.role == "tool":
            output = "".join(part.get("text") or "" for part in row.content)
            items.append(StoredItem({"id": row.id, "type": "function_call_output", "status": "completed",
                                     "call_id": row.tool_call_id, "output": output}, row.id, row.role))
            continue
        content = []
        for part in row.content:
            if part.get("transcript") is not None:
                kind = "input_audio" if row.role == "user" else "output_audio"
                content.append({"type": kind, "transcript": part["transcript"]})
            elif part.get("text"):
                content.append({"type": "output_text" if row.role == "assistant" else "input_text", "text": part["text"]})
        status = "incomplete" if row.status in ("in_progress", "incomplete", "cancelled") else "completed"
        if content:
            role = "system" if row.role == "developer" else row.role
            items.append(StoredItem({"id": row.id, "type": "message", "status": status, "role": role,
                                     "content": content}, row.id, row.role))
        for n, call in enumerate(row.tool_calls or ()):
            call_id = row.id if not content and n == 0 else f"{row.id}_{n}"
            items.append(StoredItem({"id": call_id, "type": "function_call", "status": "completed",
                                     "call_id": call["id"], "name": call["function"]["name"],
                                     "arguments": call["function"]["arguments"]}, row.id, row.role))
    return items


def stored_message(wire: dict[str, Any], status: MessageStatus) -> NewMessage:
    """An item (wire form) as a stored message."""
    if wire["type"] == "function_call":
        call = {"id": wire["call_id"], "type": "function", "function": {"name": wire["name"], "arguments": wire["arguments"]}}
        return NewMessage(role="assistant", content=[], tool_calls=[call], status=status)
    if wire["type"] == "function_call_output":
        return NewMessage(role="tool", content=[{"type": "text", "text": wire["output"]}], tool_call_id=wire["call_id"],
                          status=status)
    content = [{"type": _STORED_PART.get(part["type"], part["type"]), **{k: v for k, v in part.items() if k != "type"}}
               for part in wire.get("content", [])]
    return NewMessage(role=wire["role"], content=content, status=status)


def public_item(stored: StoredItem) -> dict[str, Any]:
    """An item in the public Conversations API's form (`openai.types.conversations.ConversationItem`): text
    parts as input_text / output_text (a spoken part as its transcript), the message's stored role."""
    wire = stored.wire
    if wire["type"] != "message":
        return dict(wire)
    content = []
    for part in wire["content"]:
        text = part["text"] if "text" in part else part["transcript"]
        if part["type"] in ("output_text", "output_audio"):
            content.append({"type": "output_text", "text": text, "annotations": []})
        else:
            content.append({"type": "input_text", "text": text})
    return {**wire, "role": stored.role, "content": content}


def without_item(row: MessageRow, item_id: str) -> list[NewMessage]:
    """What replaces a stored message once one of its items is deleted: each of its other items as a message of
    its own, whose id is that item's id (so that no other item's id changes)."""
    rest = [stored for stored in items_from_rows([row]) if stored.wire["id"] != item_id]
    kept = []
    for stored in rest:
        message = stored_message(stored.wire, cast(MessageStatus, row.status))
        message.id, message.role, message.model = stored.wire["id"], row.role, row.model
        kept.append(message)
    return kept
