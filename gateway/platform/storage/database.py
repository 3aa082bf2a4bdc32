"""Opening the database: SQLite (a file in the data folder) by default, or any SQLAlchemy async URL
(`postgresql+asyncpg://...`). Migrations run at start, then messages a crash left `in_progress` are
marked `incomplete`: they keep the text that had been written."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event, text, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.platform.storage.schema import MessageRow

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# A reply being written is touched every 0.1 s (storage/writer.py); one untouched this long lost its writer.
ORPHANED_AFTER_S = 30.0
MIGRATION_LOCK_KEY = 0x6761_7465  # "gate": the advisory lock replicas take to migrate one at a time


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{data_dir / 'gateway.db'}"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers never wait for the writer. synchronous=NORMAL in WAL mode survives a killed process
    # (a commit is in the OS's hands once written); only power loss can take the last commits.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")  # deleting a conversation deletes its messages
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


async def open_database(url: str, *, shared_by_replicas: bool = False) -> AsyncEngine:
    """Connect, migrate to the newest schema, and end the messages a crash interrupted. With
    `shared_by_replicas`, another replica may be writing a reply right now (its text every 0.1 s): only
    messages untouched for ORPHANED_AFTER_S are taken for a crashed replica's."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, pool_pre_ping=parsed.get_backend_name() != "sqlite")
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    try:
        # Replicas starting together migrate one at a time: PostgreSQL's advisory lock, a file lock for SQLite.
        async with _sqlite_migration_lock(parsed.database if parsed.get_backend_name() == "sqlite" else None):
            async with engine.begin() as connection:
                if parsed.get_backend_name() == "postgresql":
                    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
                await connection.run_sync(_migrate)
                interrupted = MessageRow.status == "in_progress"
                if shared_by_replicas:
                    interrupted &= MessageRow.updated_at < time.time() - ORPHANED_AFTER_S
                await connection.execute(update(MessageRow).where(interrupted).values(status="incomplete"))
    except BaseException:
        await engine.dispose()
        raise
    return engine


@contextlib.asynccontextmanager
async def _sqlite_migration_lock(database: str | None) -> AsyncIterator[None]:
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _migrate(connection: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
