"""openai-agents, unchanged but for its URL, against the gateway.

- Its realtime runner: three text turns, three spoken push-to-talk turns, and a cancel (interrupt). It sends
  what a client written for OpenAI sends (semantic_vad, tracing "auto", the gpt-realtime model name) and
  parses every server event into the openai SDK's types.
- A text agent on its default model, over the Responses API: a function tool called and answered, the same
  streamed, and two turns chained by previous_response_id."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, RunHooks, Runner, function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
from openai import AsyncOpenAI

from inference.tts import TtsEngine
from media.resample import resample
from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL
from tests.integration.sdk_types import assert_valid_response_event, assert_valid_response_item
from tests.integration.speech import with_silence

INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


async def open_session(gateway: GatewayProcess, modalities: list[str]) -> AsyncIterator[RealtimeSession]:
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    runner = RealtimeRunner(agent, config={"model_settings": {"output_modalities": modalities}})
    session = await runner.run(model_config={"url": f"{gateway.ws_url}/v1/realtime?model=gpt-realtime", "api_key": "unused"})
    async with session:
        yield session


@pytest.fixture
async def text_session(gateway: GatewayProcess) -> AsyncIterator[RealtimeSession]:
    async for session in open_session(gateway, ["text"]):
        yield session


@pytest.fixture
async def voice_session(gateway: GatewayProcess) -> AsyncIterator[RealtimeSession]:
    async for session in open_session(gateway, ["audio"]):
        yield session


async def until_turn_ends(session: RealtimeSession, timeout_s: float = 60.0) -> list[Any]:
    """The runner's events up to its agent_end; an error event fails the test."""
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    iterator = session.__aiter__()
    while True:
        event = await asyncio.wait_for(iterator.__anext__(), max(0.1, deadline - time.monotonic()))
        assert event.type != "error", event
        events.append(event)
        if event.type == "agent_end":
            return events


def assistant_texts(session: RealtimeSession) -> list[str]:
    texts = []
    for item in session._history:  # the runner's own view of the conversation
        if getattr(item, "role", None) == "assistant":
            texts.append(" ".join(getattr(part, "text", None) or getattr(part, "transcript", None) or ""
                                  for part in item.content))
    return texts


async def test_three_text_turns(text_session: RealtimeSession, gateway: GatewayProcess) -> None:
    for question in ("What is the capital of France?", "And of Italy?", "Thank you!"):
        await text_session.send_message(question)
        events = await until_turn_ends(text_session)
        assert any(e.type == "raw_model_event" and e.data.type == "output_text_delta" for e in events)
    replies = assistant_texts(text_session)
    assert len(replies) == 3 and all(reply.strip() for reply in replies)
    # The runner asks for tracing ("auto"): each response's log record carries the trace's workflow.
    response_ids = {e.data.data["response"]["id"] for e in events if e.type == "raw_model_event"
                    and e.data.type == "raw_server_event" and e.data.data.get("type") == "response.done"}
    records = [json.loads(line) for line in gateway.log_path.read_text(errors="replace").splitlines() if line.strip()]
    traced = {r["response_id"]: r for r in records if r.get("event") == "realtime.response.done"
              and r["response_id"] in response_ids}
    assert response_ids and set(traced) == response_ids
    assert all(r["status"] == "completed" and r["trace"]["workflow_name"] == "Realtime Session" for r in traced.values())


async def test_three_spoken_push_to_talk_turns(voice_session: RealtimeSession, tts: TtsEngine,
                                               question_pcm: np.ndarray) -> None:
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.3, 0.3)
    for _ in range(3):
        await voice_session.send_audio(speech.astype(np.int16).tobytes(), commit=True)
        events = await until_turn_ends(voice_session, timeout_s=90)
        audio = b"".join(e.audio.data for e in events if e.type == "audio")
        assert len(audio) > 24000 * 2 // 2, "at least half a second of spoken answer"
    assert len(assistant_texts(voice_session)) == 3


async def test_an_interrupt_cancels_the_reply_and_the_session_goes_on(text_session: RealtimeSession) -> None:
    await text_session.send_message("Tell me a very long story about a dragon, with many details.")
    iterator = text_session.__aiter__()
    while True:  # the reply is under way
        event = await asyncio.wait_for(iterator.__anext__(), 60)
        if event.type == "raw_model_event" and event.data.type == "output_text_delta":
            break
    await text_session.interrupt()
    await until_turn_ends(text_session)
    await text_session.send_message("What is the capital of France?")
    await until_turn_ends(text_session)
    assert len(assistant_texts(text_session)) == 2


# -- Text agents over the Responses API: openai-agents' default model (OpenAIResponsesModel), unchanged but for
# its client's URL. The 135M model seldom calls a tool on its own, and left to "auto" after a call it calls the
# same tool again: ModelSettings forces the first call, and once the tool has run a hook sets tool_choice
# "none" for the answer (the runner's own reset would leave it "auto").

class AnswerAfterTheTool(RunHooks[Any]):
    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: str) -> None:
        agent.model_settings = agent.model_settings.resolve(ModelSettings(tool_choice="none"))


def responses_agent(gateway: GatewayProcess, tools: list[Any], **settings: Any) -> Agent:
    client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    return Agent(name="Assistant", instructions=INSTRUCTIONS, tools=tools, reset_tool_choice=False,
                 model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                 model_settings=ModelSettings(max_tokens=200, temperature=0, **settings))


def weather_tool(calls: list[str]) -> Any:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny and 25 degrees in {city}."

    return get_weather


NO_TRACING = RunConfig(tracing_disabled=True)  # traces would go to OpenAI, which the tests do not reach


async def test_an_agent_calls_its_function_tool_and_answers(gateway: GatewayProcess) -> None:
    calls: list[str] = []
    agent = responses_agent(gateway, [weather_tool(calls)], tool_choice="get_weather")
    result = await Runner.run(agent, "What is the weather in Paris?", run_config=NO_TRACING, hooks=AnswerAfterTheTool())
    assert len(calls) == 1 and calls[0]
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
    assert isinstance(result.final_output, str) and result.final_output.strip()
    for response in result.raw_responses:  # as the SDK parsed them: nothing it does not declare
        for item in response.output:
            assert_valid_response_item(item)


async def test_an_agent_run_streamed(gateway: GatewayProcess) -> None:
    calls: list[str] = []
    agent = responses_agent(gateway, [weather_tool(calls)], tool_choice="required")
    result = Runner.run_streamed(agent, "What is the weather in Rome?", run_config=NO_TRACING, hooks=AnswerAfterTheTool())
    raw = []
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            assert_valid_response_event(event.data)
            raw.append(event.data.type)
    assert len(calls) == 1
    assert raw.count("response.created") == 2 and raw.count("response.completed") == 2, raw
    assert "response.function_call_arguments.done" in raw and "response.output_text.delta" in raw
    assert isinstance(result.final_output, str) and result.final_output.strip()


async def test_a_two_turn_agent_with_previous_response_id(gateway: GatewayProcess) -> None:
    agent = responses_agent(gateway, [])
    first = await Runner.run(agent, "What is the capital of France?", run_config=NO_TRACING)
    second = await Runner.run(agent, "And of Italy?", previous_response_id=first.last_response_id,
                              run_config=NO_TRACING)
    assert second.final_output.strip()
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        stored = (await http.get(f"/v1/responses/{second.last_response_id}")).json()
        inputs = (await http.get(f"/v1/responses/{second.last_response_id}/input_items")).json()["data"]
    assert stored["previous_response_id"] == first.last_response_id
    assert [item["content"][0]["text"] for item in inputs] == ["And of Italy?"]  # the turn's own input only
