"""The resumable SSE streams' state machine: ids, replay after a Last-Event-ID, what happens to a
stream nobody reads, and how long a finished one stays."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from gateway.api.stream_hub import StreamHub, request_fingerprint
from gateway.protocol.errors import ApiError


class Source:
    """An SSE source that yields `count` events, one per `pause_s`, and notes whether it was cancelled."""

    def __init__(self, count: int, pause_s: float = 0.0) -> None:
        self.count, self.pause_s = count, pause_s
        self.cancelled = False

    async def events(self) -> AsyncIterator[bytes]:
        try:
            for n in range(self.count):
                await asyncio.sleep(self.pause_s)
                yield f"data: {n}\n\n".encode()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def _collect(events: AsyncIterator[bytes], limit: int | None = None) -> list[str]:
    got = []
    async for event in events:
        got.append(event.decode())
        if limit is not None and len(got) == limit:
            break
    return got


async def test_events_carry_ids_and_a_resume_gets_exactly_the_rest() -> None:
    hub = StreamHub(window_s=60)
    buffer = hub.start("chatcmpl-1", "key", Source(6, 0.01).events(), request="r", runs_to_end=False)
    reader = hub.read(buffer)
    first = await _collect(reader, limit=2)
    await reader.aclose()  # the connection drops
    assert first == ["id: chatcmpl-1/1\ndata: 0\n\n", "id: chatcmpl-1/2\ndata: 1\n\n"]
    resumed, after = hub.get("chatcmpl-1/2", "key", "r")
    rest = await _collect(hub.read(resumed, after))
    assert [line.split("\n")[0] for line in rest] == [f"id: chatcmpl-1/{n}" for n in range(3, 7)]
    await hub.close()


async def test_a_stream_nobody_reads_runs_for_the_window_then_is_cancelled() -> None:
    hub = StreamHub(window_s=0.1)
    source = Source(1000, 0.01)
    buffer = hub.start("s", "key", source.events(), request="r", runs_to_end=False)
    await _collect(hub.read(buffer), limit=1)
    await asyncio.sleep(0.05)
    assert not source.cancelled and len(buffer.events) > 1, "it goes on generating while the client is away"
    await asyncio.sleep(0.2)
    assert source.cancelled and buffer.done
    await hub.close()


async def test_a_client_back_within_the_window_keeps_it_running() -> None:
    hub = StreamHub(window_s=0.1)
    source = Source(30, 0.01)
    buffer = hub.start("s", "key", source.events(), request="r", runs_to_end=False)
    await _collect(hub.read(buffer), limit=1)
    await asyncio.sleep(0.05)
    rest = await _collect(hub.read(*hub.get("s/1", "key", "r")))
    assert not source.cancelled and len(rest) == 29
    await hub.close()


async def test_a_stored_reply_runs_to_its_end_with_nobody_reading() -> None:
    hub = StreamHub(window_s=0.05)
    source = Source(20, 0.01)
    buffer = hub.start("s", "key", source.events(), request="r", runs_to_end=True)
    await _collect(hub.read(buffer), limit=1)
    await asyncio.sleep(0.4)
    assert buffer.done and not source.cancelled and len(buffer.events) == 20
    await hub.close()


async def test_a_finished_stream_is_readable_for_the_window_only() -> None:
    hub = StreamHub(window_s=0.1)
    buffer = hub.start("s", "key", Source(3).events(), request="r", runs_to_end=False)
    assert len(await _collect(hub.read(buffer))) == 3
    assert len(await _collect(hub.read(*hub.get("s/1", "key", "r")))) == 2
    await asyncio.sleep(0.2)
    with pytest.raises(ApiError) as gone:
        hub.get("s/1", "key", "r")
    assert gone.value.code == "stream_not_found"


@pytest.mark.parametrize(("last_event_id", "owner", "request_", "code"), [
    ("s/1", "another-key", "r", "stream_not_found"),  # another key's stream is not found, as a wrong id
    ("s/1", "another-key", "other", "stream_not_found"),
    ("t/1", "key", "r", "stream_not_found"),
    ("s/1", "key", "other", "last_event_id_reused"),  # another request never gets this stream's reply
    ("s/9", "key", "r", "invalid_value"),  # never sent
    ("s", "key", "r", "invalid_value"),
])
async def test_unusable_last_event_ids_are_refused(last_event_id: str, owner: str, request_: str, code: str) -> None:
    hub = StreamHub(window_s=60)
    buffer = hub.start("s", "key", Source(3).events(), request="r", runs_to_end=False)
    await _collect(hub.read(buffer))
    with pytest.raises(ApiError) as refused:
        hub.get(last_event_id, owner, request_)
    assert refused.value.code == code
    await hub.close()


def test_a_request_is_the_same_whatever_its_key_order_or_spacing() -> None:
    path = "/v1/chat/completions"
    same = request_fingerprint(path, json.loads('{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}'))
    assert same == request_fingerprint(path, json.loads('{"messages":[{"content":"Hi","role":"user"}],"model":"m"}'))
    assert same != request_fingerprint(path, json.loads('{"model": "m", "messages": [{"role": "user", "content": "Ho"}]}'))
    assert same != request_fingerprint("/backend-api/conversation/conv_1/messages", {"model": "m", "messages": [
        {"role": "user", "content": "Hi"}]})


async def test_closing_the_hub_cancels_running_streams() -> None:
    hub = StreamHub(window_s=60)
    source = Source(1000, 0.01)
    hub.start("s", "key", source.events(), request="r", runs_to_end=True)
    await asyncio.sleep(0.03)
    await hub.close()
    assert source.cancelled
