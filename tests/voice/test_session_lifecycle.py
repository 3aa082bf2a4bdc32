"""A closed Realtime session is freed at once, by reference counting: in a process that holds the voice
models' millions of objects, the cycle collector's full pass practically never runs, and three closed
sessions with 12 x 14 MiB of items each had kept 500 MB."""

from __future__ import annotations

import gc
import json
import weakref

from gateway.config import Settings
from gateway.runtime import Runtime
from gateway.session import RealtimeSession


async def test_a_closed_voice_session_needs_no_cycle_collector(asr):
    settings = Settings(load_voice_models=False)
    runtime = Runtime(settings)
    runtime.asr = asr  # the session gets its voice pipeline (session <-> pipeline references)
    session = RealtimeSession(runtime, settings, transport="websocket", speech_factory=None)
    session.start()
    assert session.voice is not None
    text = "x" * (1 << 20)
    for _ in range(3):
        await session.receive(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    assert len(session.conversation.items) == 3
    session_ref, voice_ref = weakref.ref(session), weakref.ref(session.voice)
    items = weakref.ref(session.conversation.items[0])
    gc.collect()
    gc.disable()
    try:
        await session.close()
        del session
        assert session_ref() is None and voice_ref() is None and items() is None
    finally:
        gc.enable()
    runtime.vad_executor.shutdown()
