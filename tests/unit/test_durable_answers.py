"""DurableAnswers holds an answer until the commits its request registered are done, and never lets a
client hear about a change whose commit failed."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.api.durable_answers import DurableAnswers
from gateway.platform.storage.answer_holds import NotDurable, hold_answer


def app_with_commit(commit: asyncio.Future[bool] | None) -> DurableAnswers:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if commit is not None:
            hold_answer(commit)
        if scope["type"] == "websocket":
            await send({"type": "websocket.send", "text": "session.created"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"the answer"})

    return DurableAnswers(app)


async def run(app: DurableAnswers, kind: str = "http") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": kind, "headers": []}, receive, send)
    return sent


async def test_the_answer_waits_for_its_commit() -> None:
    commit: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    answering = asyncio.create_task(run(app_with_commit(commit)))
    await asyncio.sleep(0.05)
    assert not answering.done(), "nothing is sent before the commit"
    commit.set_result(True)
    sent = await answering
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"the answer"
    assert (await run(app_with_commit(None)))[0]["status"] == 200  # nothing to wait for


async def test_a_failed_commit_is_never_announced() -> None:
    failed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    failed.set_result(False)
    sent = await run(app_with_commit(failed))
    assert sent[0]["status"] == 503 and len(sent) == 2
    assert json.loads(sent[1]["body"])["error"]["code"] == "storage_unavailable"
    with pytest.raises(NotDurable):  # the WebSocket's writer closes the connection (1011)
        await run(app_with_commit(failed), "websocket")
