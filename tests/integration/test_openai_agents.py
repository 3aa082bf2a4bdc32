"""The openai-agents realtime runner, unchanged but for its URL, against the gateway: three text turns,
three spoken push-to-talk turns, and a cancel (interrupt). It sends what a client written for OpenAI
sends (semantic_vad, tracing "auto", the gpt-realtime model name) and parses every server event into the
openai SDK's types."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession

from inference.tts import TtsEngine
from media.resample import resample
from tests.gateway_process import GatewayProcess
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
