"""The Realtime API over WebSocket: plain websockets client and the official SDK, text turns."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import openai
import pytest

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

TEXT_ONLY = {"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 60}}


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[RealtimeClient]:
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}")
    created = await client.recv()
    assert created["type"] == "session.created" and created["session"]["model"] == MODEL
    await client.send(TEXT_ONLY)
    await client.wait_for("session.updated")
    yield client
    await client.close()


async def test_text_turn_with_the_full_event_sequence(client: RealtimeClient) -> None:
    done = await client.ask("What is the capital of France?")
    response = done["response"]
    assert response["status"] == "completed"
    text = response["output"][0]["content"][0]["text"]
    assert text.strip()  # whatever the model says (the deltas are checked against it below)
    assert response["usage"]["output_tokens"] > 0 and response["usage"]["input_tokens"] > 0
    types = [event["type"] for event in client.events]
    order = [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    positions = [types.index(kind) for kind in order]
    assert positions == sorted(positions)
    assert "".join(e["delta"] for e in client.of_type("response.output_text.delta")) == text
    latency = json.loads(response["metadata"]["gateway_latency"])
    assert latency["first_token_ms"] is not None and latency["first_token_ms"] >= 0
    numbers = [event["sequence_number"] for event in client.events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


async def test_second_turn_sees_the_history_and_items_can_be_read_and_deleted(client: RealtimeClient) -> None:
    await client.ask("What is the capital of France?")
    await client.ask("And what is the capital of Italy?")
    added = [event["item"] for event in client.of_type("conversation.item.added")]
    assert [item["role"] for item in added] == ["user", "assistant", "user", "assistant"]
    await client.send({"type": "conversation.item.retrieve", "item_id": added[0]["id"], "event_id": "r1"})
    retrieved = await client.wait_for("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["text"] == "What is the capital of France?"
    await client.send({"type": "conversation.item.delete", "item_id": added[0]["id"]})
    assert (await client.wait_for("conversation.item.deleted"))["item_id"] == added[0]["id"]
    await client.send({"type": "conversation.item.retrieve", "item_id": added[0]["id"], "event_id": "r2"})
    error = await client.wait_for("error")
    assert error["error"]["code"] == "item_not_found" and error["error"]["event_id"] == "r2"


async def test_cancel_mid_stream_keeps_the_partial_text(client: RealtimeClient) -> None:
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story about a dragon."}]}}
    )
    await client.send({"type": "response.create", "response": {"max_output_tokens": 400}})
    for _ in range(5):
        await client.wait_for("response.output_text.delta")
    before = len(client.of_type("response.output_text.delta"))
    await client.send({"type": "response.cancel", "event_id": "cancel-1"})
    done = await client.wait_for("response.done")
    response = done["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"]["reason"] == "client_cancelled"
    # Stopped at the next token once the cancel was read: the tokens after it are those made while it was on its
    # way (counted in tokens, not milliseconds: a busy machine slows the reply and the cancel alike), not the
    # rest of a 400-token story.
    deltas = client.of_type("response.output_text.delta")
    assert len(deltas) - before <= 20 and response["usage"]["output_tokens"] < 100, (before, len(deltas), response["usage"])
    item = response["output"][0]
    streamed = "".join(e["delta"] for e in deltas)
    assert item["status"] == "incomplete" and streamed and item["content"][0]["text"].startswith(streamed)
    # The partial reply is in the conversation, marked incomplete.
    await client.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    kept = (await client.wait_for("conversation.item.retrieved"))["item"]
    assert kept["status"] == "incomplete" and kept["content"][0]["text"] == item["content"][0]["text"]
    # A cancel with nothing in progress is an error, and the session goes on.
    await client.send({"type": "response.cancel", "event_id": "cancel-2"})
    error = await client.wait_for("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("response_cancel_not_active", "cancel-2")
    answered = (await client.ask("What is the capital of France?"))["response"]
    # With a dragon story's start in context the model may run to the session's 60-token cap: either ending is a
    # reply that ran to its end, not one cut short by the earlier cancel.
    ended = (answered["status"], (answered.get("status_details") or {}).get("reason"))
    assert ended in (("completed", None), ("incomplete", "max_output_tokens")), ended
    assert answered["output"][0]["content"][0]["text"].strip()


async def test_second_response_create_while_active_is_refused(client: RealtimeClient) -> None:
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count from one to twenty."}]}}
    )
    await client.send({"type": "response.create"})
    await client.send({"type": "response.create", "event_id": "second"})
    error = await client.wait_for("error")
    assert error["error"]["code"] == "conversation_already_has_active_response"
    assert error["error"]["event_id"] == "second"
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete")
    assert len(client.of_type("response.created")) == 1


BAD_EVENTS = [
    ("{oops", "invalid_json"),
    ('"just a string"', "invalid_json"),
    ('{"type": "response.explode", "event_id": "e1"}', "unknown_event_type"),
    ('{"event_id": "e2"}', "missing_required_parameter"),
    ('{"type": "conversation.item.create", "event_id": "e3"}', "missing_required_parameter"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 42}]}}', "invalid_type"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "  "}]}}', "empty_content"),
    ('{"type": "session.update", "session": {"output_modalities": ["video"]}}', "invalid_value"),
    ('{"type": "session.update", "session": {"model": "gpt-17"}}', "model_not_found"),
    ('{"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 10}', "item_not_found"),
    ('{"type": "input_audio_buffer.append", "audio": "***not base64***"}', "invalid_audio"),
    ('{"type": "input_audio_buffer.commit"}', "input_audio_buffer_commit_empty"),
]


async def test_bad_input_gets_errors_and_loses_nothing(client: RealtimeClient) -> None:
    await client.ask("What is the capital of France?")
    for raw, code in BAD_EVENTS:
        await client.send(raw)
        error = await client.wait_for("error")
        assert error["error"]["code"] == code, (raw, error)
        assert error["error"]["message"]
    # An event over the size cap (15 MiB by default) is refused the same way.
    await client.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 * 1024 * 1024)}))
    assert (await client.wait_for("error"))["error"]["code"] == "message_too_large"
    # The conversation is intact and the session still answers, with the history.
    done = await client.ask("Repeat the name of that city.")
    assert done["response"]["status"] in ("completed", "incomplete")
    first_user = client.of_type("conversation.item.added")[0]["item"]
    await client.send({"type": "conversation.item.retrieve", "item_id": first_user["id"]})
    assert (await client.wait_for("conversation.item.retrieved"))["item"] == first_user


async def test_a_response_to_an_empty_conversation_is_refused(client: RealtimeClient) -> None:
    await client.send({"type": "response.create", "event_id": "nothing"})
    error = await client.wait_for("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("empty_conversation", "nothing")
    assert not client.of_type("response.created")


async def test_unknown_model_in_the_url_is_refused(gateway: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model=gpt-17")
    error = await client.recv()
    assert error["type"] == "error" and error["error"]["code"] == "model_not_found"
    await asyncio.wait_for(client.connection.wait_closed(), 5)


async def test_official_sdk_realtime_client(gateway: GatewayProcess) -> None:
    sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    async with sdk.realtime.connect(model=MODEL) as connection:
        await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}
        )
        await connection.response.create()
        text = ""
        async for event in connection:
            if event.type == "response.output_text.delta":
                text += event.delta
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
            elif event.type == "error":
                pytest.fail(f"error event: {event.error}")
    assert text.strip() and text == event.response.output[0].content[0].text


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                               "required": ["city"], "additionalProperties": False}}
TIME_TOOL = {"type": "function", "name": "get_time", "description": "The time in a time zone",
             "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                            "required": ["timezone"], "additionalProperties": False}}


async def test_function_call_round_trip(client: RealtimeClient) -> None:
    """A forced call: a function_call item with its argument events, listed in response.done; then the
    client's function_call_output and a response that reads it."""
    import jsonschema

    await client.send({"type": "session.update", "session": {"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "required"}})
    await client.wait_for("session.updated")
    done = await client.ask("What's the weather in Paris?")
    response = done["response"]
    assert response["status"] == "completed" and [o["type"] for o in response["output"]] == ["function_call"]
    call = response["output"][0]
    jsonschema.validate(json.loads(call["arguments"]), {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call["name"]]["parameters"])
    types = [event["type"] for event in client.events]
    for kind in ("response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in types
    assert not client.of_type("response.output_text.delta")  # no message: the reply was the call
    arguments_done = client.of_type("response.function_call_arguments.done")[-1]
    assert (arguments_done["call_id"], arguments_done["arguments"]) == (call["call_id"], call["arguments"])

    await client.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 degrees Celsius."}})
    await client.wait_for("conversation.item.done")
    await client.send({"type": "response.create", "response": {"tool_choice": "none"}})
    answer = (await client.wait_for("response.done"))["response"]
    assert answer["status"] == "completed" and answer["output"][0]["type"] == "message"
    assert "21" in answer["output"][0]["content"][0]["text"]


async def test_a_response_can_force_one_named_function(client: RealtimeClient) -> None:
    done = await client.ask("What's the weather in Paris?", tools=[WEATHER_TOOL, TIME_TOOL],
                            tool_choice={"type": "function", "name": "get_time"})
    output = done["response"]["output"]
    assert [o["name"] for o in output] == ["get_time"] and "timezone" in json.loads(output[0]["arguments"])


async def test_tool_choice_naming_no_tool_is_an_error(client: RealtimeClient) -> None:
    await client.send({"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "nope"}}})
    error = await client.wait_for("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "session.tool_choice")
    await client.send({"type": "response.create", "response": {"tool_choice": "required"}})
    error = await client.wait_for("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "response.tool_choice")


async def test_official_sdk_three_turns_push_to_talk_and_cancel(
    gateway: GatewayProcess, tts, question_pcm
) -> None:
    """The openai SDK's realtime client: three text turns, three spoken push-to-talk turns (commit then
    response.create at once) answered in speech, and a cancel; its own types parse every event."""
    import base64

    import numpy as np

    from media.resample import resample
    from tests.conftest import QUESTION
    from tests.integration.speech import HEARD_AS_SAID, heard_as, with_silence

    sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    async with sdk.realtime.connect(model="gpt-realtime") as connection:
        await connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                                 "audio": {"input": {"turn_detection": None}}})

        async def until(kind: str) -> list:
            events = []
            async for event in connection:
                assert event.type != "error", event
                events.append(event)
                if event.type == kind:
                    return events
            raise AssertionError("the connection ended")

        for question in ("What is the capital of France?", "And of Italy?", "Thanks!"):
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]})
            await connection.response.create()
            done = (await until("response.done"))[-1]
            assert done.response.status == "completed" and done.response.output[0].content[0].text

        speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 0.5).astype(np.int16)
        await connection.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        for _ in range(3):  # spoken push-to-talk turns, answered in speech
            await connection.input_audio_buffer.append(audio=base64.b64encode(speech.tobytes()).decode())
            await connection.input_audio_buffer.commit()
            await connection.response.create()
            events = await until("response.done")
            transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
            # The question, give or take a word (with AVX2-only kernels Whisper once heard "France" as
            # "friends"): the test is about the client, not the ASR.
            assert heard_as(transcript.transcript, QUESTION) >= HEARD_AS_SAID, transcript.transcript
            assert events[-1].response.status == "completed" and events[-1].response.output[0].content[0].transcript
            assert sum(len(e.delta) for e in events if e.type == "response.output_audio.delta") > 24000
        await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})

        await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a very long story about a dragon."}]})
        await connection.response.create(response={"max_output_tokens": 400})
        await until("response.output_text.delta")
        await connection.response.cancel()
        done = (await until("response.done"))[-1]
        assert done.response.status == "cancelled"
