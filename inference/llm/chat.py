"""Chat messages to prompt tokens: the tokenizer's own chat template, and trimming to the context window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from inference.llm.tool_calls import ToolFormat, write_calls

Role = Literal["system", "developer", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None


class ContextOverflow(ValueError):
    """The instructions plus the newest message do not fit in the context window."""


@dataclass
class RenderedPrompt:
    token_ids: list[int]
    dropped_messages: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


def _template_messages(messages: Sequence[ChatMessage], tool_format: ToolFormat = "list") -> list[dict[str, Any]]:
    """Map OpenAI roles onto what small chat templates know.

    System and developer instructions are merged into one leading system message, because many
    templates (SmolLM2's among them) only honour a system message in first position. Assistant tool
    calls are written as the model writes them (tool_calls.py), and tool results as text it can read.
    """
    instructions = [m.content for m in messages if m.role in ("system", "developer") and m.content]
    rendered: list[dict[str, Any]] = []
    called = {call.get("id"): call.get("function", call).get("name") for m in messages for call in _calls(m)}
    if instructions:
        rendered.append({"role": "system", "content": "\n\n".join(instructions)})
    for message in messages:
        if message.role in ("system", "developer"):
            continue
        if message.role == "tool":
            name = called.get(message.tool_call_id) or "the function"
            rendered.append({"role": "user", "content": f"{name} returned: {message.content}"})
        elif message.role == "assistant" and (calls := _calls(message)):
            rendered.append({"role": "assistant", "content": write_calls(message.content, calls, tool_format)})
        else:
            rendered.append({"role": message.role, "content": message.content})
    return rendered


def _calls(message: ChatMessage) -> tuple[dict[str, Any], ...]:
    """The message's calls that have OpenAI's shape. The API validates them; a history stored before it
    did may hold others, which are left out rather than failing every later prompt of the conversation."""
    return tuple(call for call in message.tool_calls
                 if isinstance(call, dict) and isinstance(call.get("function", call), dict))


def _encode(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def draft_prompt_ids(tokenizer: Any, messages: Sequence[ChatMessage], user_text: str) -> list[int]:
    """Tokens of a conversation followed by the start of a user turn, ending right after `user_text`.

    This is a prefix of the prompt the finished turn will have, so it can be prefilled early.
    """
    marker = "\u2063"  # invisible separator: found again after templating, then cut off
    templated = _template_messages([*messages, ChatMessage("user", user_text + marker)])
    text = tokenizer.apply_chat_template(templated, add_generation_prompt=False, tokenize=False)
    cut = text.rfind(marker)
    if cut < 0:
        return []
    return list(tokenizer(text[:cut], add_special_tokens=False)["input_ids"])


def render_prompt(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    *,
    context_window: int,
    reserve_tokens: int,
    tools: list[dict[str, Any]] | None = None,
    tool_format: ToolFormat = "list",
) -> RenderedPrompt:
    """Tokenize a conversation, dropping its oldest turns until `reserve_tokens` fit after it.

    Instructions (system, developer) are always kept, and so is the newest message. `tools` go to a
    template that renders them ("template" format, tool_calls.py), which also shapes the history's calls.
    """
    budget = context_window - reserve_tokens
    if budget <= 0:
        raise ContextOverflow(f"max tokens ({reserve_tokens}) leaves no room in the {context_window}-token context")
    templated = _template_messages(messages, tool_format)
    has_system = bool(templated) and templated[0]["role"] == "system"
    head = templated[:1] if has_system else []
    turns = templated[1:] if has_system else templated
    dropped = 0
    while True:
        kept = head + turns[dropped:]
        ids = _encode(tokenizer, kept, tools)
        if len(ids) <= budget:
            return RenderedPrompt(token_ids=ids, dropped_messages=dropped, messages=kept)
        if dropped >= len(turns) - 1:
            raise ContextOverflow(
                f"the prompt needs {len(ids)} tokens but only {budget} fit "
                f"(context {context_window}, {reserve_tokens} reserved for the answer)"
            )
        dropped += 1
        # Never start the kept history with an orphan assistant reply.
        while dropped < len(turns) - 1 and turns[dropped]["role"] == "assistant":
            dropped += 1
