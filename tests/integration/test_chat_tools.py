"""Function calling and structured outputs in Chat Completions, through the official openai SDK against
the embedded 135M model: a forced call is always valid (grammar-constrained), whatever the model."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.gateway_process import GatewayProcess

MODEL = "gpt-4o-mini"  # an OpenAI name: the served model answers to it
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather like in Paris right now?"}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def assert_valid_calls(calls: Any, names: set[str]) -> None:
    assert calls, "a call was forced"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_gives_valid_calls(client: openai.OpenAI, temperature: float) -> None:
    for seed in range(3):
        completion = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                    temperature=temperature, seed=seed, max_tokens=120)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))


def test_a_named_function_is_the_one_called_even_when_it_does_not_fit(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, temperature=0, max_tokens=120)
    calls = completion.choices[0].message.tool_calls
    assert_valid_calls(calls, {"get_time"})
    assert len(calls) == 1


def test_streamed_calls_then_the_result_gets_an_answer(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                            temperature=0, max_tokens=120, stream=True)
    deltas, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert_valid_calls(deltas, set(SCHEMAS))
    call = deltas[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny and 21 degrees Celsius."}]
    # The 135M model, left to decide ("auto"), calls again after a result; told not to, it reads the result.
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=60)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "21" in (choice.message.content or "")


def test_tool_choice_none_keeps_the_tools_away(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",
                                                temperature=0, max_tokens=40)
    choice = completion.choices[0]
    assert not choice.message.tool_calls and choice.message.content and "<tool_call>" not in choice.message.content


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_always_validates(client: openai.OpenAI, stream: bool) -> None:
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                               "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                                           "maxItems": 3}},
              "required": ["name", "age", "hobbies"], "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}}
    for seed in range(3):
        kwargs: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a person."}],
                                      response_format=fmt, temperature=1.0, seed=seed, max_tokens=150)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                           if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        jsonschema.validate(json.loads(text), person)


def test_json_object_output_is_an_object(client: openai.OpenAI) -> None:
    """The reply is a JSON object: whole where the model ends it, its beginning where the token limit cuts it (how
    long a small model's object runs is the model's, not the grammar's)."""
    completion = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}],
                                                response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    choice = completion.choices[0]
    content = choice.message.content or ""
    assert content.startswith("{") and choice.finish_reason in ("stop", "length"), content
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_frequency_penalty_reaches_the_sampler(client: openai.OpenAI) -> None:
    """Greedy counting repeats its tokens; a frequency penalty makes it stop sooner (both deterministic)."""
    ask = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    plain, penalized = (client.chat.completions.create(
        model=MODEL, messages=ask, temperature=0, max_tokens=50, frequency_penalty=penalty,
        extra_body={"repetition_penalty": 1.0}).choices[0].message.content for penalty in (0.0, 1.5))
    assert plain != penalized


@pytest.mark.parametrize(("body", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"logprobs": True}, "logprobs"),
])
def test_bad_tool_and_format_requests_are_400_with_the_param(client: openai.OpenAI, body: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, extra_body=body)
    assert caught.value.body["param"] == param, caught.value.body
