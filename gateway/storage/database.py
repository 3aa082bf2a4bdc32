"""Opening the database: SQLite (a file in the data folder) by default, or any SQLAlchemy async URL
(`postgresql+asyncpg://...`). Migrations run at start, then messages a crash left `in_progress` are
marked `incomplete`: they keep the text that had been written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.storage.schema import MessageRow

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


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


async def open_database(url: str) -> AsyncEngine:
    """Connect, migrate to the newest schema, and end the messages a crash interrupted."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, pool_pre_ping=parsed.get_backend_name() != "sqlite")
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_migrate)
            await connection.execute(update(MessageRow).where(MessageRow.status == "in_progress")
                                     .values(status="incomplete"))
    except BaseException:
        await engine.dispose()
        raise
    return engine


def _migrate(connection: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
