"""The conversation store on each database it supports: SQLite (always) and a real PostgreSQL server
(Debian's `postgresql`, started here on loopback when it is installed)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.protocol.errors import ApiError
from gateway.storage.conversations import ConversationStore, NewMessage
from gateway.storage.database import open_database, sqlite_url


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway cluster: initdb (as the postgres user when run as root), trust auth on 127.0.0.1 only."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if run_as:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                    f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder}", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


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
