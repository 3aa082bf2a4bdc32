"""A response's items as the chat messages its prompt is made of, and as stored conversation messages.

Items are in the Responses API's wire form (what input_items lists and a response's output holds): messages
(text parts), `function_call` and `function_call_output`. An assistant message and the calls after it are one
assistant turn of the prompt, as a chat completion's message with `tool_calls` is.
"""

from __future__ import annotations

from typing import Any

from gateway.generation.conversation_items import stored_message
from gateway.platform.storage.conversations import MessageStatus, NewMessage
from inference.llm.chat import ChatMessage


def _part_text(part: dict[str, Any]) -> str:
    return str(part.get("text") if part.get("type") != "refusal" else part.get("refusal")) or ""


def item_message(item: dict[str, Any]) -> ChatMessage:
    """One item as one chat message (a call as an assistant message with that call only)."""
    if item["type"] == "function_call":
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        return ChatMessage("assistant", "", tool_calls=(call,))
    if item["type"] == "function_call_output":
        return ChatMessage("tool", item["output"], tool_call_id=item["call_id"])
    return ChatMessage(item["role"], "".join(_part_text(part) for part in item["content"]))


def merge_turns(messages: list[ChatMessage]) -> list[ChatMessage]:
    """An assistant message's calls join it: the calls after an assistant message (or after other calls)
    are that turn's."""
    merged: list[ChatMessage] = []
    for message in messages:
        last = merged[-1] if merged else None
        if last is not None and last.role == "assistant" and message.role == "assistant" and message.tool_calls:
            merged[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, *message.tool_calls))
        else:
            merged.append(message)
    return merged


def items_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    return merge_turns([item_message(item) for item in items])


def conversation_message(item: dict[str, Any], status: MessageStatus) -> NewMessage:
    """An item as a stored conversation message (conversation_items.py's mapping), its text parts as text."""
    if item["type"] != "message":
        return stored_message(item, status)
    kind = "output_text" if item["role"] == "assistant" else "input_text"
    content = [{"type": kind, "text": _part_text(part)} for part in item["content"]]
    return stored_message({"type": "message", "role": item["role"], "content": content}, status)
