"""What must survive a restart besides conversations: unspent client secrets, idempotency records and
rate-limit buckets. The in-memory objects (auth.Authenticator, idempotency.IdempotencyStore,
ratelimit.RateLimiter) answer requests; this journal writes their changes to the database from one
task it owns, coalesced into one transaction, and restores them when the gateway starts.

A client secret minted or spent and an Idempotency-Key answer are written at once, and the answer that
announces them waits for the commit (durable_answers.py), so a kill -9 cannot revive a spent secret or
run a retried request twice. The driver commits off the event loop (aiosqlite's thread, asyncpg): only
that request waits. Rate-limit buckets change with every request and are written behind, every FLUSH_S:
a kill forgets at most that much of a bucket's use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.platform.storage.answer_holds import hold_answer
from gateway.platform.storage.schema import ClientSecretRow, IdempotencyRow, RateLimitRow

log = logging.getLogger(__name__)
FLUSH_S = 0.2


@dataclass
class Snapshot:
    secrets: list[ClientSecretRow] = field(default_factory=list)
    idempotency: list[IdempotencyRow] = field(default_factory=list)
    buckets: list[RateLimitRow] = field(default_factory=list)


class DurableState:
    def __init__(self, engine: AsyncEngine) -> None:
        self._session = async_sessionmaker(engine, expire_on_commit=False)
        self._secrets: dict[str, ClientSecretRow | None] = {}  # digest -> row to write, or None: delete
        self._records: dict[tuple[str, str], IdempotencyRow] = {}
        self._buckets: dict[str, RateLimitRow] = {}
        # Resolved (True: committed) by the flush that writes the urgent changes made so far.
        self._commit: asyncio.Future[bool] | None = None
        self._urgent = asyncio.Event()  # wakes the writer before FLUSH_S is up
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def load(self, idempotency_ttl_s: float) -> Snapshot:
        """What is still valid (expired secrets and records are deleted), then the writer starts."""
        now = time.time()
        async with self._session.begin() as session:
            await session.execute(delete(ClientSecretRow).where(ClientSecretRow.expires_at <= now))
            await session.execute(delete(IdempotencyRow).where(IdempotencyRow.created_at <= now - idempotency_ttl_s))
            snapshot = Snapshot(
                secrets=list(await session.scalars(select(ClientSecretRow))),
                idempotency=list(await session.scalars(select(IdempotencyRow))),
                buckets=list(await session.scalars(select(RateLimitRow))),
            )
        self._task = asyncio.create_task(self._run(), name="durable state writer")
        return snapshot

    # The journal: synchronous, called by the in-memory objects as they change.

    def secret_minted(self, digest: str, owner: str, session: dict[str, Any], expires_at: float) -> None:
        self._secrets[digest] = ClientSecretRow(digest=digest, owner=owner, session=session, expires_at=expires_at)
        self._write_now()

    def secret_spent(self, digest: str) -> None:
        self._secrets[digest] = None
        self._write_now()

    def response_stored(self, owner: str, key: str, fingerprint: str, created_at: float, status: int,
                        media_type: str, body: bytes, headers: dict[str, str]) -> None:
        self._records[(owner, key)] = IdempotencyRow(owner=owner, key=key, fingerprint=fingerprint,
                                                     created_at=created_at, status=status, media_type=media_type,
                                                     body=body, headers=headers)
        self._write_now()

    def bucket(self, owner: str, tokens: float, updated_at: float) -> None:
        self._buckets[owner] = RateLimitRow(owner=owner, tokens=tokens, updated_at=updated_at)

    def _write_now(self) -> None:
        """Commit what is pending without waiting for FLUSH_S; the current request's answer waits for it."""
        if self._commit is None:
            self._commit = asyncio.get_running_loop().create_future()
        hold_answer(self._commit)
        self._urgent.set()

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._urgent.wait(), FLUSH_S)
            self._urgent.clear()
            await self.flush()

    async def flush(self) -> None:
        secrets, records, buckets, commit = self._secrets, self._records, self._buckets, self._commit
        if not (secrets or records or buckets):
            return
        self._secrets, self._records, self._buckets, self._commit = {}, {}, {}, None
        committed = False
        try:
            async with self._session.begin() as session:
                spent = [digest for digest, row in secrets.items() if row is None]
                if spent:
                    await session.execute(delete(ClientSecretRow).where(ClientSecretRow.digest.in_(spent)))
                for row in [*(r for r in secrets.values() if r is not None), *records.values(), *buckets.values()]:
                    await session.merge(row)
            committed = True
        except Exception:
            log.exception("writing client secrets, idempotency records and rate limits failed")
        finally:
            if commit is not None:
                commit.set_result(committed)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Shutdown: the writer finishes its flush (not cut mid-commit), then what is pending is written."""
        self._closing = True
        self._urgent.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout_s)
            self._task.cancel()  # a database that hangs: give up on it
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
