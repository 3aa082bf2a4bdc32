"""The conversation store on each database it supports: SQLite (always) and a real PostgreSQL server
(Debian's `postgresql`, started here on loopback when it is installed)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import update

from gateway.platform.storage.conversations import ConversationStore, NewMessage
from gateway.platform.storage.database import ORPHANED_AFTER_S, open_database, sqlite_url
from gateway.platform.storage.schema import MessageRow
from gateway.protocol.errors import ApiError
from tests.integration.postgres_server import postgres_url  # noqa: F401 (a fixture, used by name)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ConversationStore]:
    url = sqlite_url(tmp_path) if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    opened = ConversationStore(await open_database(url))
    yield opened
    await opened.close()


async def test_conversation_tree_pages_and_owners(store: ConversationStore) -> None:
    owner = f"key_{time.monotonic_ns()}"  # the PostgreSQL cluster is shared by this module's tests
    conversation = await store.create(owner, "first")
    question = NewMessage("user", [{"type": "text", "text": "Hi"}])
    reply = NewMessage("assistant", [], status="in_progress", model="m")
    await store.append(conversation.id, None, [question, reply])
    await store.save_message(reply.id, content=[{"type": "text", "text": "Hello"}], status="completed", output_tokens=2)
    again = NewMessage("user", [{"type": "text", "text": "Hi again"}])
    await store.append(conversation.id, question.id, [again])  # a sibling of the reply: a new branch

    current = await store.get(owner, conversation.id)
    assert current.current_leaf_id == again.id
    assert [m.id for m in await store.branch(current)] == [question.id, again.id]
    assert [m.id for m in await store.branch(current, reply.id)] == [question.id, reply.id]
    await store.update(owner, conversation.id, current_leaf_id=reply.id, title="renamed")
    branch = await store.branch(await store.get(owner, conversation.id))
    assert [m.content for m in branch] == [[{"type": "text", "text": "Hi"}], [{"type": "text", "text": "Hello"}]]
    assert branch[1].status == "completed" and branch[1].output_tokens == 2

    for _ in range(3):
        await store.create(owner)
    first = await store.list(owner, after=None, limit=2, order="desc")
    rest = await store.list(owner, after=first.rows[-1].id, limit=10, order="desc")
    assert first.has_more and not rest.has_more and len(first.rows) + len(rest.rows) == 4
    assert (await store.list("someone_else", after=None, limit=10, order="desc")).rows == []
    with pytest.raises(ApiError) as refused:
        await store.get("someone_else", conversation.id)
    assert refused.value.status == 404

    await store.delete(owner, conversation.id)
    assert await store.all_messages(conversation.id) == []


async def test_a_restart_ends_interrupted_messages(store: ConversationStore, tmp_path: Path) -> None:
    owner = f"key_{time.monotonic_ns()}"
    conversation = await store.create(owner)
    reply = NewMessage("assistant", [{"type": "text", "text": "Once upon"}], status="in_progress")
    await store.append(conversation.id, None, [reply])
    url = store.engine.url.render_as_string(hide_password=False)
    reopened = ConversationStore(await open_database(url))  # what a start after a crash does
    try:
        [message] = await reopened.all_messages(conversation.id)
        assert message.status == "incomplete" and message.content == [{"type": "text", "text": "Once upon"}]
    finally:
        await reopened.close()


async def test_a_replica_starting_ends_only_the_replies_no_replica_is_writing(store: ConversationStore) -> None:
    """With several replicas on one database, a start must not end another replica's reply in progress
    (written every 0.1 s), only one untouched since before ORPHANED_AFTER_S (its replica crashed)."""
    owner = f"key_{time.monotonic_ns()}"
    conversation = await store.create(owner)
    live = NewMessage("assistant", [{"type": "text", "text": "Being written"}], status="in_progress")
    orphan = NewMessage("assistant", [{"type": "text", "text": "Left behind"}], status="in_progress")
    await store.append(conversation.id, None, [orphan, live])
    async with store.engine.begin() as connection:  # its replica crashed a while ago
        await connection.execute(update(MessageRow).where(MessageRow.id == orphan.id)
                                 .values(updated_at=time.time() - ORPHANED_AFTER_S - 5))
    url = store.engine.url.render_as_string(hide_password=False)
    reopened = ConversationStore(await open_database(url, shared_by_replicas=True))
    try:
        statuses = {message.id: message.status for message in await reopened.all_messages(conversation.id)}
        assert statuses == {orphan.id: "incomplete", live.id: "in_progress"}
    finally:
        await reopened.close()
