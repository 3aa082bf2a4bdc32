"""The function-call format of the model's replies: parsing, streaming hold-back, and history."""

from __future__ import annotations

import json

import pytest

from inference.llm.chat import ChatMessage, _template_messages
from inference.llm.tool_calls import ReplySplitter, ToolSpec, parse_reply, write_calls

TOOLS = [ToolSpec("get_weather", "Weather", {"type": "object"}), ToolSpec("get_time")]


def test_a_call_block_becomes_calls_and_the_rest_stays_text() -> None:
    reply = parse_reply('Let me check.\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                        '{"name": "get_time", "arguments": "{\\"city\\": \\"Rome\\"}"}]</tool_call>', TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Rome"})]
    assert reply.content == "Let me check."
    assert len({c.id for c in reply.calls}) == 2 and all(c.id.startswith("call_") for c in reply.calls)


@pytest.mark.parametrize("text", [
    "Plain answer.",
    '<tool_call>[{"name": "unknown_tool", "arguments": {}}]</tool_call>',
    '<tool_call>[{"name": "get_time", "arguments": {"city": </tool_call>',
    '<tool_call>[{"name": "get_time", "arguments": [1]}]</tool_call>',
    '<tool_call>[{"name": "get_time"', 
])
def test_anything_but_valid_calls_to_known_tools_stays_text(text: str) -> None:
    reply = parse_reply(text, TOOLS)
    assert reply.calls == [] and reply.content == text


def test_the_splitter_sends_text_and_holds_back_what_may_be_a_call() -> None:
    splitter = ReplySplitter()
    sent = [splitter.feed(d) for d in ["Sure", ", one moment <", "tool", "_call>[{\"name\"", ": 1}]</tool_call>"]]
    assert "".join(sent) == "Sure, one moment "
    assert splitter.held == '<tool_call>[{"name": 1}]</tool_call>'
    plain = ReplySplitter()
    sent = [plain.feed(d) for d in ["a <b", "> c <tool", " d"]]
    assert "".join(sent) + plain.held == "a <b> c <tool d" and plain.held == ""


def test_history_calls_are_written_as_the_model_writes_them() -> None:
    calls = ({"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Rome"}'}},)
    text = write_calls(None, calls)
    assert parse_reply(text, TOOLS).calls[0].arguments == '{"city": "Rome"}'
    assert write_calls("Checking.", calls).startswith("Checking.\n<tool_call>")


def test_a_stored_history_with_malformed_calls_still_renders() -> None:
    """Histories stored before the API validated tool_calls may hold any JSON there: such calls are left out
    of the prompt (it was an AttributeError, and every later turn of the conversation failed)."""
    good = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    history = [ChatMessage("user", "Time?"), ChatMessage("assistant", "", ({"function": 5}, "x", good)),  # type: ignore[arg-type]
               ChatMessage("tool", "noon", tool_call_id="call_1"), ChatMessage("user", "Thanks.")]
    rendered = _template_messages(history)
    assert rendered[1] == {"role": "assistant", "content": write_calls("", (good,))}
    assert rendered[2] == {"role": "user", "content": "get_time returned: noon"}
