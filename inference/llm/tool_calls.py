"""Function calling on a small local model: how tools are described, how calls are written, and the
grammar that makes a forced call valid.

Two formats, chosen by the model's chat template (`template_tool_format`):
- "list": the template knows no tools (SmolLM2's, the embedded model's). The tools are described in the
  system message and the model calls them by writing ``<tool_call>[{"name": ..., "arguments": {...}}]
  </tool_call>``, the format SmolLM2 was tuned on; one block holds every call of the turn.
- "template": the template renders the tools itself (Qwen's, Hermes' and others'): they go to it, and
  the model calls as those templates teach, one ``<tool_call>\n{"name": ..., "arguments": ...}\n
  </tool_call>`` block per call.
With `tool_choice` "required" or a named function, decoding is constrained to the format's blocks
(constraints.py), so the arguments always parse and match each function's JSON schema. With "auto" the
model decides, and its reply is parsed (either format): a block that does not parse stays text.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from inference.llm.constraints import json_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
ToolFormat = Literal["list", "template"]
_PROBE_TOOL = "probe_tool_7f3a"


def template_tool_format(tokenizer: Any) -> ToolFormat:
    """"template" when the chat template renders the tools it is given (and so tells the model how to call)."""
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[tool], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # a template that cannot take tools, or a tokenizer without a template
        return "list"
    return "template" if _PROBE_TOOL in str(text) else "list"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments object

    def schema(self) -> dict[str, Any]:
        return self.parameters or {"type": "object"}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it: a string

    @classmethod
    def new(cls, name: str, arguments: dict[str, Any]) -> ToolCall:
        return cls("call_" + secrets.token_hex(12), name, json.dumps(arguments, ensure_ascii=False))

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's `tool_calls` entry (with `index` in a streamed chunk)."""
        obj: dict[str, Any] = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return obj if index is None else {"index": index, **obj}


def openai_tool(tool: ToolSpec) -> dict[str, Any]:
    """As chat templates take tools: OpenAI's chat `tools` entry."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.schema()}}

def tool_instructions(tools: list[ToolSpec], *, forced: str | None, parallel: bool) -> str:
    """The system message's part about the tools. `forced`: "required", a function's name, or None (auto)."""
    listed = "\n".join(
        json.dumps({"name": t.name, "description": t.description or "", "parameters": t.schema()}, ensure_ascii=False)
        for t in tools
    )
    how = f'{OPEN}[{{"name": "function name", "arguments": {{"argument name": "value"}}}}]{CLOSE}'
    lines = ["You can call these functions:", "<tools>", listed, "</tools>", f"To call functions, reply with only {how}."]
    if parallel:
        lines.append("Put every call you need in the one list.")
    lines.append(_forced_line(forced) if forced is not None else "If no function is needed, answer the user directly.")
    return "\n".join(lines)


def _call_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    one_call = [
        {"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.schema()},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools
    ]
    return one_call[0] if len(one_call) == 1 else {"anyOf": one_call}


def tool_call_block(tools: list[ToolSpec], *, parallel: bool, fmt: ToolFormat = "list") -> str:
    """A Lark expression for the valid calls to `tools` in `fmt` (give one tool to force that function)."""
    # The markers stand alone as literals: where the tokenizer has one as a token of its own (Qwen's
    # <tool_call>), the grammar compiler makes the literal that token (constraints.GrammarCompiler).
    if fmt == "template":
        block = f'"{OPEN}" "\\n" {json_value(_call_schema(tools))} "\\n" "{CLOSE}"'
        return f'{block} ("\\n" {block})*' if parallel else block
    array: dict[str, Any] = {"type": "array", "items": _call_schema(tools), "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return f'"{OPEN}" {json_value(array)} "{CLOSE}"'


def write_calls(content: str | None, tool_calls: tuple[dict[str, Any], ...], fmt: ToolFormat = "list") -> str:
    """An assistant turn's calls (OpenAI's `tool_calls` objects) as the model writes them, for the history."""
    calls = []
    for call in tool_calls:
        function = call.get("function", call)
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments  # kept as the client sent it
        calls.append({"name": function.get("name"), "arguments": parsed})
    if fmt == "template":
        block = "\n".join(f"{OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{CLOSE}" for call in calls)
    else:
        block = OPEN + json.dumps(calls, ensure_ascii=False) + CLOSE
    return f"{content}\n{block}" if content else block


@dataclass(frozen=True)
class ToolUse:
    """What a reply may do with its tools: those the model is told of (and its reply is parsed for), what
    the system message says of them, the tools for the chat template ("template" format), and the Lark
    expression the whole output must match when a call is forced."""

    tools: list[ToolSpec]
    instructions: str | None = None
    forced_block: str | None = None
    template_tools: list[dict[str, Any]] | None = None


def plan_tool_use(tools: list[ToolSpec], *, choice: str, name: str | None = None, parallel: bool = True,
                  fmt: ToolFormat = "list", builtin: list[ToolSpec] | None = None) -> ToolUse:
    """`choice`: "auto", "none", "required", or "function" (then `name` is the one to call, the client's or a
    built-in one). `builtin`: the server's own tools, offered beside the client's `tools` unless the choice is
    "none" or names one of the client's (a client's tool of the same name wins)."""
    client_names = {tool.name for tool in tools}
    if builtin and choice != "none" and not (choice == "function" and name in client_names):
        tools = tools + [tool for tool in builtin if tool.name not in client_names]
    if choice == "none" or not tools:
        return ToolUse([])
    forced = name if choice == "function" else ("required" if choice == "required" else None)
    if fmt == "template":  # the template describes the tools; the system message only says what is forced
        instructions = None if forced is None else _forced_line(forced)
        template_tools = [openai_tool(tool) for tool in tools]
    else:
        instructions, template_tools = tool_instructions(tools, forced=forced, parallel=parallel), None
    if forced is None:
        return ToolUse(tools, instructions, None, template_tools)
    callable_tools = tools if forced == "required" else [t for t in tools if t.name == forced]
    block = tool_call_block(callable_tools, parallel=parallel and forced == "required", fmt=fmt)
    return ToolUse(tools, instructions, block, template_tools)


def _forced_line(forced: str) -> str:
    return "You must call a function now." if forced == "required" else f"You must call the function {forced} now."


@dataclass
class ParsedReply:
    content: str | None
    calls: list[ToolCall]


def parse_reply(text: str, tools: list[ToolSpec]) -> ParsedReply:
    """The calls in a finished reply, and the text around them. A block that is not valid calls to known
    functions is left as text: the client sees what the model wrote rather than losing it."""
    names = {t.name for t in tools}
    calls: list[ToolCall] = []
    for block in _BLOCK.findall(text):
        try:
            parsed = json.loads(block)
        except ValueError:
            return ParsedReply(text, [])
        for call in parsed if isinstance(parsed, list) else [parsed]:
            arguments = call.get("arguments") if isinstance(call, dict) else None
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return ParsedReply(text, [])
            if not isinstance(call, dict) or call.get("name") not in names or not isinstance(arguments, dict):
                return ParsedReply(text, [])
            calls.append(ToolCall.new(call["name"], arguments))
    if not calls:
        return ParsedReply(text, [])
    rest = _BLOCK.sub("", text).strip()
    return ParsedReply(rest or None, calls)


class ReplySplitter:
    """Streams a reply's text while holding back what may be the start of a call block.

    `feed` returns the text that is surely not part of a call; from the first `<tool_call>` on,
    everything is kept for `parse_reply` at the end."""

    def __init__(self) -> None:
        self.text = ""  # everything fed
        self._sent = 0
        self._in_call = False

    def feed(self, delta: str) -> str:
        self.text += delta
        if self._in_call:
            return ""
        start = self.text.find(OPEN, self._sent)
        if start >= 0:
            self._in_call = True
            return self._release(start)
        # Hold back a tail that could still become "<tool_call>".
        keep = next((n for n in range(min(len(OPEN) - 1, len(self.text) - self._sent), 0, -1)
                     if OPEN.startswith(self.text[-n:])), 0)
        return self._release(len(self.text) - keep)

    def _release(self, end: int) -> str:
        out, self._sent = self.text[self._sent:end], max(self._sent, end)
        return out

    @property
    def held(self) -> str:
        """What was not sent as text (a call block, or a tail that never became one)."""
        return self.text[self._sent:]
