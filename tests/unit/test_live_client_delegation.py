"""A client delegation through the real session and Live front: the live model's delegate call (here the core's
response.done that carries it: the embedded 135M model never calls the tool by itself) becomes
session.delegation.created for the application, which answers with context tied to the delegation's id."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.protocol.live_events import ClientDelegation, LiveSessionConfig
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_front import LiveFront
from gateway.realtime.live_wire import LiveTranslator
from gateway.realtime.outbox import Outbox
from gateway.realtime.session import RealtimeSession
from media.playout import PlayoutBuffer
from tests.integration.sdk_types import assert_valid_live_event


async def drain(session: RealtimeSession) -> list[dict[str, Any]]:
    events = []
    reader = session.outbox.attach()
    while session.outbox._queue:
        wire = await reader.next()
        assert wire is not None
        events.append(json.loads(wire))
    for event in events:
        assert_valid_live_event(event)
    return events


async def test_the_live_models_delegate_call_goes_to_the_application_which_answers_it() -> None:
    settings = Settings(load_voice_models=False)
    runtime = Runtime(settings)
    delegation = ClientDelegation(type="client", acknowledgement_delay_ms=60_000)
    config = LiveSessionConfig(model="gpt-live-1", delegation=delegation)
    started = time.monotonic()
    translator = LiveTranslator(config, "gpt-live-1", lambda: int((time.monotonic() - started) * 1000))
    session = RealtimeSession(runtime, settings, transport="live", speech_factory=None, outbox=Outbox(numbered=False),
                              translate=translator)
    front = LiveFront(session, translator, LiveAudioStream("audio/pcm", 24000), PlayoutBuffer(24000, 480), started,
                      delegation=delegation, prepare=None)
    try:
        session.start()
        assert [e["type"] for e in await drain(session)] == ["session.started"]
        session.send({"type": "response.done", "response": {"id": "resp_1", "output": [
            {"type": "function_call", "name": "delegate", "call_id": "call_1", "arguments": '{"task": "Book it."}'}]}})
        await asyncio.sleep(0)  # handled after the core's step
        events = await drain(session)
        assert [e["type"] for e in events] == ["session.usage.updated", "session.delegation.created"]
        created = events[1]["delegation"]
        assert created["target"] == "client" and "response_id" not in created
        output = session.conversation.items[-1]
        assert (output.type, output.call_id) == ("function_call_output", "call_1")  # the live conversation is whole

        await front.receive(json.dumps({"type": "session.thinking.append", "content": "Booked for 8 pm.",
                                        "delegation_id": created["id"], "event_id": "evt_1"}))
        [acknowledged] = await drain(session)
        assert acknowledged["type"] == "session.thinking.appended" and acknowledged["client_event_id"] == "evt_1"
        await front.receive(json.dumps({"type": "session.thinking.append", "content": "x",
                                        "delegation_id": "deleg_unknown"}))
        [refused] = await drain(session)
        assert refused["error"]["code"] == "invalid_value" and refused["error"]["param"] == "delegation_id"
    finally:
        await front.close()
        await session.close()
        runtime.vad_executor.shutdown()
