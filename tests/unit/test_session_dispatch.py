"""A defect in handling one event costs that event, not the session: the client gets `server_error`
and the session answers the next event (before, any non-ApiError closed the socket with 1000 "OK")."""

from __future__ import annotations

import json

from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.realtime.session import RealtimeSession


async def _drain(session: RealtimeSession) -> list[dict]:
    events = []
    reader = session.outbox.attach()
    while session.outbox._queue:
        events.append(json.loads(await reader.next()))
    return events


async def test_an_unexpected_exception_becomes_a_server_error_event(monkeypatch):
    settings = Settings(load_voice_models=False)
    runtime = Runtime(settings)
    session = RealtimeSession(runtime, settings, transport="websocket", speech_factory=None)
    session.start()
    await _drain(session)
    original = session._dispatch

    async def broken_once(event):
        monkeypatch.setattr(session, "_dispatch", original)
        raise KeyError("a bug")

    monkeypatch.setattr(session, "_dispatch", broken_once)
    await session.receive('{"type": "input_audio_buffer.clear", "event_id": "ev1"}')
    [error] = await _drain(session)
    assert error["type"] == "error" and error["error"]["code"] == "server_error"
    assert error["error"]["event_id"] == "ev1" and error["error"]["type"] == "server_error"
    await session.receive(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
    assert [e["type"] for e in await _drain(session)] == ["conversation.item.added", "conversation.item.done"]
    await session.close()
    runtime.vad_executor.shutdown()
