"""A key's memories and its memory switch in the database (what gateway/generation/memory.py recalls and saves)."""

from __future__ import annotations

import builtins  # the store has a method named list

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.platform.storage.schema import MemoryRow, MemorySettingRow, epoch, new_id
from gateway.protocol.errors import ApiError

MAX_MEMORIES = 200  # per key; past it the oldest is forgotten
MAX_MEMORY_CHARS = 1000


def memory_not_found(memory_id: str) -> ApiError:
    return ApiError("memory_not_found", f"No memory '{memory_id}'.", "memory_id", status=404)


class MemoryStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._session = async_sessionmaker(engine, expire_on_commit=False)

    async def enabled(self, owner: str) -> bool:
        async with self._session() as session:
            return await session.get(MemorySettingRow, owner) is not None

    async def set_enabled(self, owner: str, enabled: bool) -> None:
        async with self._session.begin() as session:
            row = await session.get(MemorySettingRow, owner)
            if enabled and row is None:
                session.add(MemorySettingRow(owner=owner, enabled_at=epoch()))
            elif not enabled and row is not None:
                await session.delete(row)

    async def add(self, owner: str, content: str) -> MemoryRow:
        row = MemoryRow(id=new_id("mem"), owner=owner, content=content[:MAX_MEMORY_CHARS], created_at=epoch())
        async with self._session.begin() as session:
            session.add(row)
            count = await session.scalar(select(func.count()).select_from(MemoryRow).where(MemoryRow.owner == owner))
            if count is not None and count >= MAX_MEMORIES:  # the new one is not flushed yet: forget the oldest
                oldest = select(MemoryRow.id).where(MemoryRow.owner == owner).order_by(MemoryRow.id)
                doomed = list(await session.scalars(oldest.limit(count + 1 - MAX_MEMORIES)))
                await session.execute(delete(MemoryRow).where(MemoryRow.id.in_(doomed)))
        return row

    async def list(self, owner: str) -> builtins.list[MemoryRow]:
        """Newest first."""
        async with self._session() as session:
            query = select(MemoryRow).where(MemoryRow.owner == owner).order_by(MemoryRow.id.desc())
            return list(await session.scalars(query))

    async def delete(self, owner: str, memory_id: str) -> None:
        async with self._session.begin() as session:
            row = await session.get(MemoryRow, memory_id)
            if row is None or row.owner != owner:
                raise memory_not_found(memory_id)
            await session.delete(row)

    async def delete_all(self, owner: str) -> int:
        async with self._session.begin() as session:
            result = await session.execute(delete(MemoryRow).where(MemoryRow.owner == owner))
            return int(getattr(result, "rowcount", 0) or 0)
