"""What a reply asks of the model, whichever API asked for it (its ReplyForm: a chat completion's, a Responses
API response's, a Realtime response's, a conversation message's, a title's): its messages (with the tools
described), the grammar its output must follow, and which tools its reply may call.

- `tool_choice` "none": the tools are neither described nor parsed.
- "auto" (the default with tools): described; the reply is parsed for calls (tool_calls.py).
- "required" or a named function: the output is constrained to one block of valid calls.
- `response_format` json_object / json_schema: the content is constrained to JSON (that schema's).
  With "auto" tools as well, the output is either a call block or that JSON.
- `text_grammar`: the text follows that grammar (a conversation's title: titles.py).
- `builtin`: the gateway's own tools (memory's `remember`), described and callable beside the client's
  unless tool_choice is "none" or names one of the client's; tool_choice may name one. The reply is parsed
  for the client's tools only: the gateway runs its own (memory_tool.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gateway.protocol.chat import MEMORY_TOOL_NAME, ChatCompletionRequest, NamedToolChoice
from inference.llm.chat import ChatMessage
from inference.llm.constraints import json_schema_grammar, json_value
from inference.llm.tool_calls import ToolFormat, ToolSpec, plan_tool_use, tool_call_block

ToolChoice = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ReplyForm:
    """What a request asks of its reply's form, whichever API it came through (a chat completion, a response):
    the client's tools and which it must or may call, and the JSON its text must be."""

    tools: list[ToolSpec]
    choice: ToolChoice | None = None  # None: "auto" when a tool is offered, else "none"
    function: str | None = None  # the function that choice "function" names
    parallel: bool = True
    json_schema: dict[str, Any] | None = None  # the text is JSON under this schema
    any_json_object: bool = False  # the text is a JSON object, any (json_object)
    text_grammar: str | None = None  # the text follows this llguidance Lark grammar (constraints.py)

    @classmethod
    def of_chat(cls, chat: ChatCompletionRequest) -> ReplyForm:
        tools = [ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in chat.tools or []]
        choice = chat.tool_choice
        response_format = chat.response_format
        schema = response_format.json_schema.schema_ if response_format and response_format.json_schema else None
        return cls(tools, "function" if isinstance(choice, NamedToolChoice) else choice,
                   choice.function.name if isinstance(choice, NamedToolChoice) else None, chat.parallel_tool_calls,
                   schema, response_format is not None and response_format.type == "json_object")

    @property
    def names_memory_tool(self) -> bool:
        """The choice names the built-in memory tool (and no tool of the client's has that name)."""
        return (self.choice == "function" and self.function == MEMORY_TOOL_NAME
                and all(tool.name != MEMORY_TOOL_NAME for tool in self.tools))

    def after_memory_saved(self) -> ReplyForm:
        """The form of the reply's second round, after the model saved memories: a choice that named the memory
        tool is spent."""
        return replace(self, choice=None, function=None) if self.names_memory_tool else self


@dataclass
class ChatPlan:
    messages: list[ChatMessage]
    grammar: str | None = None  # llguidance Lark (constraints.py); None: unconstrained
    tools: list[ToolSpec] = field(default_factory=list)  # what the reply is parsed for: the client's tools
    template_tools: list[dict[str, Any]] | None = None  # for a chat template that renders tools
    builtin_offered: bool = False  # the model may call a built-in tool


def plan_reply(form: ReplyForm, fmt: ToolFormat, *, messages: list[ChatMessage],
               builtin: list[ToolSpec] | None = None) -> ChatPlan:
    """The plan for `messages` (the prompt before the tools' and the format's instructions) and `form`."""
    messages, builtin = list(messages), builtin or []
    client_tools = form.tools
    choice = form.choice or ("auto" if client_tools or builtin else "none")
    use = plan_tool_use(client_tools, choice=choice, name=form.function, parallel=form.parallel, fmt=fmt,
                        builtin=builtin)
    instructions = [use.instructions] if use.instructions else []
    schema = None
    if form.any_json_object:
        schema = {"type": "object"}
        instructions.append("Reply with a JSON object.")
    elif form.json_schema is not None:
        schema = form.json_schema
        instructions.append(f"Reply with JSON that matches this schema: {json.dumps(schema, ensure_ascii=False)}")
    grammar = None
    if use.forced_block is not None:
        grammar = f"start: {use.forced_block}"
    elif schema is not None and use.tools:
        grammar = f"start: {tool_call_block(use.tools, parallel=form.parallel, fmt=fmt)} | {json_value(schema)}"
    elif schema is not None:
        grammar = json_schema_grammar(schema)
    elif form.text_grammar is not None:
        grammar = form.text_grammar
    if instructions:  # merged after the client's own instructions into the one system message
        messages.append(ChatMessage("system", "\n\n".join(instructions)))
    offered = use.tools[len(client_tools):]  # the built-in tools offered, after the client's
    return ChatPlan(messages=messages, grammar=grammar, tools=use.tools[:len(client_tools)],
                    template_tools=use.template_tools, builtin_offered=bool(offered))
