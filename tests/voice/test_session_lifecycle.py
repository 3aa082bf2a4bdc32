"""A closed Realtime session is freed at once, by reference counting: in a process that holds the voice
models' millions of objects, the cycle collector's full pass practically never runs, and three closed
sessions with 12 x 14 MiB of items each had kept 500 MB."""

from __future__ import annotations

import gc
import json
import weakref

from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.realtime.session import RealtimeSession


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
    # A response asked for (refused: no model here) went through the response driver and back as an input.
    await session.receive(json.dumps({"type": "response.create"}))
    session_ref, voice_ref = weakref.ref(session), weakref.ref(session.voice)
    responses_ref = weakref.ref(session.response_driver)
    items = weakref.ref(session.conversation.items[0])
    gc.collect()
    gc.disable()
    try:
        await session.close()
        del session
        assert session_ref() is None and voice_ref() is None and responses_ref() is None and items() is None
    finally:
        gc.enable()
    runtime.vad_executor.shutdown()


async def test_a_spoken_turn_past_the_conversation_bound_is_an_error_and_the_session_goes_on(asr, tts, question_pcm):
    """A turn the VAD ends must join the conversation in the same step; when the conversation is full it
    gets `conversation_full` and the voice pipeline keeps listening (it had run in the pipeline's own task)."""
    import asyncio
    import base64

    import numpy as np

    from media.resample import resample
    from tests.integration.speech import with_silence

    settings = Settings(load_voice_models=False, max_conversation_items=1)
    runtime = Runtime(settings)
    runtime.asr = asr
    session = RealtimeSession(runtime, settings, transport="websocket", speech_factory=None)
    session.start()
    await session.receive(json.dumps({"type": "session.update", "session": {"output_modalities": ["text"], "audio": {
        "input": {"turn_detection": {"type": "server_vad", "create_response": False}}}}}))
    await session.receive(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.3, 1.0).astype(np.int16)
    await session.receive(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(speech.tobytes()).decode()}))
    events: list[dict] = []
    reader = session.outbox.attach()

    async def until(kind: str) -> dict:
        while True:
            wire = await asyncio.wait_for(reader.next(), 30)
            assert wire is not None
            events.append(json.loads(wire))
            if events[-1]["type"] == kind:
                return events[-1]

    error = await until("error")
    assert error["error"]["code"] == "conversation_full"
    assert [e["type"] for e in events].count("input_audio_buffer.speech_stopped") == 1
    await session.receive(json.dumps({"type": "input_audio_buffer.clear"}))
    await until("input_audio_buffer.cleared")
    assert session.voice is not None and session.voice._task is not None and not session.voice._task.done()
    await session.close()
    runtime.vad_executor.shutdown()
