"""The Responses API (/v1/responses) through the official openai SDK and raw HTTP, against the real model:
every object, item and stream event is checked against the SDK's own types, undeclared fields failing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.integration.sdk_types import assert_valid_response, assert_valid_response_event, assert_valid_response_item

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
# A bounded name: an unbounded string let a sampled reply run past its tokens (incomplete JSON, a flaky test).
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120) as http:
        yield http


def create(client: openai.OpenAI, **body: Any) -> dict[str, Any]:
    """A response, as it came over the wire (checked), not as the SDK parsed it."""
    raw = client.responses.with_raw_response.create(model=MODEL, **body)
    response: dict[str, Any] = raw.http_response.json()
    assert_valid_response(response)
    return response


def sse_events(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed response's events, raw, each checked, numbered 0, 1, 2, ... and named as its type."""
    events: list[dict[str, Any]] = []
    with http.stream("POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}) as response:
        assert response.status_code == 200, response.read()
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                assert_valid_response_event(event)
                assert event["type"] == name
                events.append(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


def output_text(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def test_sdk_plain(client: openai.OpenAI) -> None:
    response = create(client, input="What is the capital of France?", temperature=0, max_output_tokens=30,
                      metadata={"topic": "geography"})
    assert response["status"] == "completed" and response["object"] == "response"
    assert output_text(response).strip()  # whatever the model says (the SDK's reading of it is checked below)
    assert response["metadata"] == {"topic": "geography"}
    usage = response["usage"]
    assert usage["input_tokens"] > 10 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    # The same prompt again: its prefix is cached.
    again = create(client, input="What is the capital of France?", temperature=0, max_output_tokens=30)
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0
    parsed = client.responses.create(model=MODEL, input="What is the capital of France?", temperature=0,
                                     max_output_tokens=30)
    assert parsed.output_text == output_text(response)


def test_sdk_streamed(client: openai.OpenAI, http: httpx.Client) -> None:
    events = sse_events(http, {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 30,
                               "instructions": "Answer in one short sentence."})
    kinds = [event["type"] for event in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    done = next(event for event in events if event["type"] == "response.output_text.done")
    final = events[-1]["response"]
    assert deltas == done["text"] == output_text(final) and deltas.strip()
    assert final["instructions"] == "Answer in one short sentence."
    # The SDK's own stream, and its helper that assembles the response.
    streamed = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, stream=True))
    for event in streamed:
        assert_valid_response_event(event)
    with client.responses.stream(model=MODEL, input="What is the capital of France?", temperature=0,
                                 max_output_tokens=30) as stream:
        kinds = [event.type for event in stream]  # the helper's own events (with its `snapshot`), from checked ones
        assembled = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    not_streamed = create(client, input="What is the capital of France?", temperature=0, max_output_tokens=30)
    assert assembled.output_text.strip() and assembled.output_text == output_text(not_streamed)  # greedy: the same


def test_text_format_json_schema_and_json_object(client: openai.OpenAI) -> None:
    response = create(client, input="Invent a person.", max_output_tokens=60, temperature=0,
                      text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    assert response["status"] == "completed", response
    person = json.loads(output_text(response))
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and isinstance(person["age"], int)
    assert response["text"]["format"]["name"] == "person"
    anything = create(client, input="Describe a cat as JSON.", max_output_tokens=40, temperature=0,
                      text={"format": {"type": "json_object"}})
    # Constrained to a JSON object: whole when it completed, its beginning when the tokens ran out first.
    text = output_text(anything)
    assert text.lstrip().startswith("{"), text
    if anything["status"] == "completed":
        assert isinstance(json.loads(text), dict)
    else:
        assert anything["incomplete_details"]["reason"] == "max_output_tokens"
    refused = httpx.post(f"{client.base_url}responses", json={
        "model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "bad", "schema": {"type": 5}}}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "text.format.schema"


def test_a_forced_call_its_output_and_the_answer(client: openai.OpenAI, http: httpx.Client) -> None:
    called = create(client, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                    max_output_tokens=60, temperature=0)
    calls = [item for item in called["output"] if item["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and "city" in json.loads(calls[0]["arguments"])
    answer = create(client, previous_response_id=called["id"], tools=[WEATHER], max_output_tokens=30, temperature=0,
                    input=[{"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "Sunny, 25 C"}])
    assert answer["previous_response_id"] == called["id"] and answer["output"]
    # Named, and streamed: the arguments arrive as function_call_arguments events.
    events = sse_events(http, {"input": "Weather in Rome?", "tools": [WEATHER], "max_output_tokens": 60,
                               "temperature": 0, "tool_choice": {"type": "function", "name": "get_weather"}})
    kinds = [event["type"] for event in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    done = events[4]
    assert json.loads(done["arguments"]) == json.loads(events[-1]["response"]["output"][0]["arguments"])
    # "none": the tools are not offered; parallel_tool_calls false: one call at most.
    plain = create(client, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="none",
                   max_output_tokens=8)
    assert plain["tool_choice"] == "none" and all(item["type"] == "message" for item in plain["output"])
    single = create(client, input="Weather in Paris and in Rome?", tools=[WEATHER], tool_choice="required",
                    parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    assert single["parallel_tool_calls"] is False
    assert [item["type"] for item in single["output"]] == ["function_call"]
    # With the whole history as input instead (what a client without stored responses sends).
    history = [{"role": "user", "content": "What is the weather in Paris?"}, calls[0],
               {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "Sunny, 25 C"}]
    assert output_text(create(client, input=history, tools=[WEATHER], max_output_tokens=20, store=False))


def test_previous_response_id_carries_inputs_and_outputs_not_instructions(client: openai.OpenAI) -> None:
    first = create(client, input="My name is Ada.", instructions="Reply in one sentence.", max_output_tokens=20)
    second = create(client, input="What is my name?", previous_response_id=first["id"], max_output_tokens=20,
                    temperature=0)
    assert second["instructions"] is None and second["previous_response_id"] == first["id"]
    # The prompt is the first exchange and the new input, without the first's instructions: the same prompt as
    # that history sent whole.
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": output_text(first)},
               {"role": "user", "content": "What is my name?"}]
    whole = create(client, input=history, max_output_tokens=1, store=False)
    assert second["usage"]["input_tokens"] == whole["usage"]["input_tokens"]


def test_get_delete_and_input_items(client: openai.OpenAI, http: httpx.Client) -> None:
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}]
    response = create(client, input=items, max_output_tokens=8)
    assert http.get(f"/v1/responses/{response['id']}").json() == response
    assert_valid_response(client.responses.retrieve(response["id"]))
    listed = http.get(f"/v1/responses/{response['id']}/input_items", params={"order": "asc"}).json()
    assert listed["object"] == "list" and not listed["has_more"] and len(listed["data"]) == 4
    for item in listed["data"]:
        assert_valid_response_item(item)
    assert [item["role"] for item in listed["data"]] == ["developer", "user", "assistant", "user"]
    assert listed["data"][3]["content"] == [{"type": "input_text", "text": "Name a colour."}]
    first = http.get(f"/v1/responses/{response['id']}/input_items", params={"limit": 1}).json()  # desc: the last first
    assert first["has_more"] and first["data"][0]["id"] == listed["data"][3]["id"]
    rest = http.get(f"/v1/responses/{response['id']}/input_items", params={"limit": 10, "after": first["last_id"]}).json()
    assert [item["id"] for item in rest["data"]] == [item["id"] for item in listed["data"][2::-1]]
    pages = list(client.responses.input_items.list(response["id"], limit=2))  # the SDK follows the cursor
    assert len(pages) == 4
    assert http.get(f"/v1/responses/{response['id']}", params={"include": ["reasoning.encrypted_content"]}).status_code == 400
    assert http.delete(f"/v1/responses/{response['id']}").json() == {"id": response["id"], "object": "response",
                                                                      "deleted": True}
    for gone in (http.get(f"/v1/responses/{response['id']}"), http.delete(f"/v1/responses/{response['id']}"),
                 http.get(f"/v1/responses/{response['id']}/input_items")):
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"


def test_idempotency_key_replays_the_first_answer(http: httpx.Client) -> None:
    body = {"model": MODEL, "input": "Say a random word.", "temperature": 1.5, "max_output_tokens": 8}
    headers = {"idempotency-key": "responses-key-1"}
    first = http.post("/v1/responses", json=body, headers=headers)
    second = http.post("/v1/responses", json=body, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() and second.headers.get("idempotent-replayed") == "true"
    other = http.post("/v1/responses", json={**body, "max_output_tokens": 9}, headers=headers)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_store_false_is_not_kept(client: openai.OpenAI, http: httpx.Client) -> None:
    response = create(client, input="Hi", store=False, max_output_tokens=4)
    assert http.get(f"/v1/responses/{response['id']}").status_code == 404
    refused = http.post("/v1/responses", json={"model": MODEL, "input": "And?", "previous_response_id": response["id"]})
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "previous_response_id"


def test_cancel_stops_a_streamed_response(client: openai.OpenAI, http: httpx.Client) -> None:
    events: list[dict[str, Any]] = []
    first_delta = threading.Event()

    def read() -> None:
        with http.stream("POST", "/v1/responses", json={"model": MODEL, "stream": True, "max_output_tokens": 400,
                                                         "input": "Tell me a very long story about a dragon."}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: "):]))
                    if events[-1]["type"] == "response.output_text.delta":
                        first_delta.set()
        first_delta.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first_delta.wait(120)
    response_id = events[0]["response"]["id"]
    assert http.get(f"/v1/responses/{response_id}").json()["status"] == "in_progress"
    with httpx.Client(base_url=str(http.base_url), timeout=60) as other:
        cancelled = other.post(f"/v1/responses/{response_id}/cancel")
    reader.join(60)
    assert cancelled.status_code == 200, cancelled.text
    assert_valid_response(cancelled.json())
    assert cancelled.json()["status"] == "cancelled"
    for event in events:
        assert_valid_response_event(event)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "response_cancelled"
    assert http.get(f"/v1/responses/{response_id}").json()["status"] == "cancelled"
    again = http.post(f"/v1/responses/{response_id}/cancel")
    assert again.status_code == 400 and again.json()["error"]["code"] == "response_not_in_progress"
    assert http.post("/v1/responses/resp_none/cancel").status_code == 404


def test_truncation(http: httpx.Client) -> None:
    long_ago = {"role": "user", "content": "Tell me about this text: " + "lorem ipsum dolor sit amet " * 1800}
    items = [long_ago, {"role": "assistant", "content": "It repeats."}, {"role": "user", "content": "What is 2 + 2?"}]
    refused = http.post("/v1/responses", json={"model": MODEL, "input": items, "max_output_tokens": 8})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    fits = http.post("/v1/responses", json={"model": MODEL, "input": items, "max_output_tokens": 8, "truncation": "auto"})
    assert fits.status_code == 200 and fits.json()["truncation"] == "auto"
    assert fits.json()["usage"]["input_tokens"] < 1000  # the oldest items were dropped


async def test_a_response_in_a_conversation_is_seen_by_a_realtime_session(gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    conversation = client.conversations.create().id
    response = create(client, input="My name is Ada.", conversation=conversation, max_output_tokens=12)
    assert response["conversation"] == {"id": conversation}
    second = create(client, input="What is my name?", conversation={"id": conversation}, max_output_tokens=12)
    assert second["usage"]["input_tokens"] > response["usage"]["input_tokens"]
    realtime = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}&conversation={conversation}")
    try:
        assert (await realtime.recv())["type"] == "session.created"
        await realtime.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
        await realtime.wait_for("session.updated")
        loaded = [event["item"] for event in realtime.of_type("conversation.item.done")]
    finally:
        await realtime.close()
    assert [(item["role"], item["content"][0].get("text")) for item in loaded] == [
        ("user", "My name is Ada."), ("assistant", output_text(response)),
        ("user", "What is my name?"), ("assistant", output_text(second))]
    missing = httpx.post(f"{gateway.url}/v1/responses", json={"model": MODEL, "input": "x", "conversation": "conv_none"})
    assert missing.status_code == 404


@pytest.mark.parametrize(("extra", "param"), [
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
    ({"tools": [{"type": "image_generation"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"max_tool_calls": 3}, "max_tool_calls"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"stream_options": {"include_obfuscation": True}, "stream": True}, "stream_options.include_obfuscation"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
])
def test_what_is_not_served_is_refused_by_name(http: httpx.Client, extra: dict[str, Any], param: str) -> None:
    refused = http.post("/v1/responses", json={"model": MODEL, "input": "Hi", **extra})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == param and "not served" in error["message"]


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    ({"input": "Hi", "temprature": 1}, 400, "unknown_parameter", "temprature"),
    ({"input": "Hi", "temperature": 3}, 400, "invalid_value", "temperature"),
    ({"input": 5}, 400, "invalid_type", "input"),
    ({"input": []}, 400, "invalid_value", "input"),
    ({"input": " ", "previous_response_id": "resp_1"}, 400, "invalid_value", "input"),
    ({"input": [{"role": "robot", "content": "Hi"}]}, 400, "invalid_value", "input[0].role"),
    ({"input": [{"role": "developer", "content": []}]}, 400, "invalid_value", "input[0]"),
    ({"input": [{"role": "developer", "content": "Be brief."}]}, 400, "invalid_value", "input"),
    ({"input": [{"role": "user", "content": "Hi", "colour": "red"}]}, 400, "unknown_parameter", "input[0].colour"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "missing_required_parameter",
     "input[0].call_id"),
    ({"input": "Hi", "tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
    ({"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, 400, "invalid_value",
     "tool_choice.name"),
    ({"input": "Hi", "metadata": {f"k{n}": "v" for n in range(17)}}, 400, "invalid_value", "metadata"),
    ({"input": "Hi", "metadata": {"k": "v" * 513}}, 400, "invalid_value", "metadata"),
    ({"input": "Hi", "previous_response_id": "resp_1", "conversation": "conv_1"}, 400, "invalid_value", "conversation"),
    ({"input": "Hi", "previous_response_id": "resp_none"}, 404, "response_not_found", "previous_response_id"),
    ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, 400, "invalid_value", "text.format"),
])
def test_bad_requests_name_the_field(http: httpx.Client, body: dict[str, Any], status: int, code: str,
                                     param: str) -> None:
    refused = http.post("/v1/responses", json={"model": MODEL, **body})
    assert refused.status_code == status, refused.text
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (code, param)


# -- The safety policy and memory, as for chat ------------------------------------------------------------

@pytest.fixture(scope="module")
def safe_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Denies "Paris" (the model's answer to the question, so the reply is stopped) and "secret project"; its own
    database, so that turning memory on there changes no other gateway's prompts."""
    folder = tmp_path_factory.mktemp("responses-safety")
    denylist = folder / "denylist.txt"
    denylist.write_text("Paris\nsecret project\n", encoding="utf-8")
    process = start_gateway("--safety-denylist", str(denylist), "--no-load-voice-models", "--data-dir",
                            str(folder / "data"), log_path=folder / "gateway.log")
    yield process
    process.stop()


def test_the_safety_policy_screens_the_input_and_stops_the_reply(safe_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{safe_gateway.url}/v1", api_key="unused", max_retries=0)
    with httpx.Client(base_url=safe_gateway.url, timeout=120) as http:
        refused = http.post("/v1/responses", json={"model": MODEL, "input": [
            {"role": "user", "content": "Hi"}, {"role": "user", "content": "Tell me about the SECRET project."}]})
        assert refused.status_code == 400
        assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("content_policy_violation",
                                                                                         "input[1].content")
        stopped = create(client, input="What is the capital of France?", temperature=0, max_output_tokens=40)
        assert stopped["status"] == "incomplete" and stopped["incomplete_details"] == {"reason": "content_filter"}
        parts = stopped["output"][0]["content"]
        assert [part["type"] for part in parts] == ["output_text", "refusal"] and "Paris" not in parts[0]["text"]
        assert parts[1]["refusal"] == "The reply was stopped by the content policy (rule: denylist)."
        events = sse_events(http, {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 40})
    kinds = [event["type"] for event in events]
    assert "response.refusal.done" in kinds and kinds[-1] == "response.incomplete"
    assert "Paris" not in "".join(event.get("delta", "") for event in events)


def test_personal_data_is_redacted_before_the_model_reads_it(client: openai.OpenAI) -> None:
    def read(text: str) -> int:
        return int(create(client, input=text, max_output_tokens=1, store=False)["usage"]["input_tokens"])

    assert read("Write to jane.roe@example.org today.") == read("Write to [email] today.")


def test_memory_works_as_for_chat(safe_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{safe_gateway.url}/v1", api_key="unused", max_retries=0)
    assert httpx.post(f"{safe_gateway.url}/v1/memories/settings", json={"enabled": True}).status_code == 200
    saved = create(client, input="Remember that my dog is called Rex.", max_output_tokens=8, metadata={"topic": "pets"})
    assert saved["metadata"]["topic"] == "pets" and saved["metadata"]["memories_saved"]
    used = create(client, input="What is my dog called?", max_output_tokens=16, temperature=0)
    assert used["metadata"]["memories_used"] == saved["metadata"]["memories_saved"]


def test_a_dropped_stream_resumes_with_last_event_id(http: httpx.Client) -> None:
    body = {"model": MODEL, "stream": True, "input": "Count from one to twenty in words.", "max_output_tokens": 60,
            "temperature": 0}
    before: list[dict[str, Any]] = []
    last_id = None
    with http.stream("POST", "/v1/responses", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("id: "):
                last_id = line[len("id: "):]
            elif line.startswith("data: "):
                before.append(json.loads(line[len("data: "):]))
                if len(before) == 6:
                    break  # the connection drops here
    assert last_id is not None
    after: list[dict[str, Any]] = []
    with http.stream("POST", "/v1/responses", json=body, headers={"last-event-id": last_id}) as response:
        assert response.status_code == 200
        after = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    events = before + after
    for event in events:
        assert_valid_response_event(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert text == output_text(events[-1]["response"])
    other = http.post("/v1/responses", json={**body, "input": "Something else."}, headers={"last-event-id": last_id})
    assert other.status_code == 422
