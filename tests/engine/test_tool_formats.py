"""The two function-call formats against a real tokenizer: SmolLM2's template knows no tools ("list":
the gateway describes them), a Hermes-style template renders them ("template": one block per call).
In each, the forced grammar accepts exactly that format's valid calls and the parser reads them back."""

from __future__ import annotations

import copy
import json

import pytest

from inference.llm.chat import ChatMessage, render_prompt
from inference.llm.constraints import GrammarCompiler, GrammarError
from inference.llm.tool_calls import ToolSpec, parse_reply, plan_tool_use, template_tool_format

# The shape of Qwen's and Hermes' templates, reduced to what matters here.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n"
    "</tools>\nFor each function call, return a json object within <tool_call></tool_call> tags.<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
WEATHER = ToolSpec("get_weather", "The weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                                  "required": ["city"], "additionalProperties": False})
TIME = ToolSpec("get_time", None, {"type": "object", "properties": {"zone": {"type": "string"}},
                                   "required": ["zone"], "additionalProperties": False})


@pytest.fixture
def hermes_tokenizer(lm):
    tokenizer = copy.deepcopy(lm.tokenizer)
    tokenizer.chat_template = HERMES_TEMPLATE
    return tokenizer


def accepts(compiler: GrammarCompiler, grammar: str, tokenizer, text: str) -> bool:
    constraint = compiler.constraint(grammar)
    try:
        for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
            if not constraint.allowed()[token]:
                return False
            constraint.advance(token)
    except GrammarError:
        return False
    return constraint.finished or bool(constraint.allowed()[tokenizer.eos_token_id])


def test_the_format_follows_the_template(lm, hermes_tokenizer) -> None:
    assert template_tool_format(lm.tokenizer) == "list" and lm.tool_format == "list"
    assert template_tool_format(hermes_tokenizer) == "template"


def test_list_format_tools_are_described_by_the_gateway_and_forced_in_one_block(lm) -> None:
    use = plan_tool_use([WEATHER, TIME], choice="required", parallel=True, fmt="list")
    assert use.template_tools is None and "get_weather" in (use.instructions or "")
    grammar = f"start: {use.forced_block}"
    compiler = GrammarCompiler(lm.tokenizer, int(lm.model.config.vocab_size))
    good = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "UTC"}}]</tool_call>'
    assert accepts(compiler, grammar, lm.tokenizer, good)
    assert not accepts(compiler, grammar, lm.tokenizer, '<tool_call>[{"name": "get_weather", "arguments": {}}]</tool_call>')
    assert [c.name for c in parse_reply(good, [WEATHER, TIME]).calls] == ["get_weather", "get_time"]


def test_template_format_tools_go_to_the_template_and_calls_are_one_block_each(lm, hermes_tokenizer) -> None:
    use = plan_tool_use([WEATHER, TIME], choice="function", name="get_time", parallel=True, fmt="template")
    assert use.instructions == "You must call the function get_time now."
    prompt = render_prompt(hermes_tokenizer, [ChatMessage("user", "What time is it in Tokyo?"),
                                             ChatMessage("system", use.instructions)],
                           context_window=4096, reserve_tokens=64, tools=use.template_tools, tool_format="template")
    text = hermes_tokenizer.decode(prompt.token_ids)
    assert "# Tools" in text and '"name": "get_weather"' in text
    compiler = GrammarCompiler(hermes_tokenizer, int(lm.model.config.vocab_size))
    grammar = f"start: {use.forced_block}"
    good = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}\n</tool_call>'
    assert accepts(compiler, grammar, hermes_tokenizer, good)
    assert not accepts(compiler, grammar, hermes_tokenizer, good.replace("get_time", "get_weather"))
    calls = parse_reply(good, [WEATHER, TIME]).calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "Asia/Tokyo"})]
    history = [ChatMessage("user", "Time?"), ChatMessage("assistant", "", tool_calls=(
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}},))]
    rendered = render_prompt(hermes_tokenizer, history, context_window=4096, reserve_tokens=64,
                             tools=use.template_tools, tool_format="template")
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>' in \
        hermes_tokenizer.decode(rendered.token_ids)


class _AddedTokens:
    """A tokenizer's added tokens, as Qwen2.5's has them: its call markers are tokens of their own."""

    def get_added_vocab(self) -> dict[str, int]:
        return {"<tool_call>": 151657, "</tool_call>": 151658, "<|im_end|>": 151645, "x": 7}


def test_a_literal_that_is_one_added_token_becomes_that_token_outside_json_schemas() -> None:
    """The model writes Qwen's <tool_call> as one token, which llguidance matches only by id: a forced call's
    grammar names it `<[151657]>` (the real model's run: tests/integration/test_users_model.py); the same text
    inside a schema stays a string, and a grammar without added tokens is untouched."""
    tools = [ToolSpec("get_weather", None, {"type": "object", "properties": {"tag": {"const": "<tool_call>"}}})]
    block = plan_tool_use(tools, choice="required", fmt="template").forced_block
    assert block is not None
    rewritten = GrammarCompiler(_AddedTokens(), 10).with_added_tokens(f"start: {block} | \"<|im_end|>\"")
    assert rewritten.startswith("start: <[151657]> ") and '"\\n" <[151658]>' in rewritten
    assert rewritten.endswith("| <[151645]>") and '"const": "<tool_call>"' in rewritten
    assert GrammarCompiler(object(), 10).with_added_tokens(block) == block
