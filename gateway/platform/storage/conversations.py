"""Conversations as trees of messages, owned by API keys. Every method is one transaction; nothing here
blocks the event loop (the drivers are asyncio ones: aiosqlite's thread, asyncpg)."""

from __future__ import annotations

import asyncio
import builtins  # the store has a method named list
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.platform.storage.schema import ConversationRow, MessageRow, epoch, new_id
from gateway.protocol.errors import ApiError

Order = Literal["asc", "desc"]
MessageStatus = Literal["in_progress", "completed", "cancelled", "truncated", "incomplete"]


@dataclass
class NewMessage:
    role: str
    content: list[dict[str, Any]]
    status: MessageStatus = "completed"
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    model: str | None = None
    id: str = field(default_factory=lambda: new_id("msg"))


@dataclass(frozen=True)
class Page:
    rows: Sequence[Any]
    has_more: bool


def not_found(conversation_id: str) -> ApiError:
    # Another key's conversation is "not found" too: its existence is not for others to learn.
    return ApiError("conversation_not_found", f"No conversation '{conversation_id}'.", "conversation_id", status=404)


class ConversationStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._session = async_sessionmaker(engine, expire_on_commit=False)
        self._writers: set[asyncio.Task[None]] = set()  # writes behind streams (writer.py), awaited at close

    def track(self, task: asyncio.Task[None]) -> None:
        self._writers.add(task)
        task.add_done_callback(self._writers.discard)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let the writes under way finish (their streams have ended by now), then disconnect."""
        if self._writers:
            _, late = await asyncio.wait(self._writers, timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        await self.engine.dispose()

    async def create(self, owner: str, title: str | None = None, *, metadata: dict[str, str] | None = None,
                     messages: Sequence[NewMessage] = ()) -> ConversationRow:
        """A new conversation, with `messages` as its first chain when given."""
        now = epoch()
        row = ConversationRow(id=new_id("conv"), owner=owner, title=title, conversation_metadata=metadata,
                              created_at=now, updated_at=now)
        async with self._session.begin() as session:
            session.add(row)
            await session.flush()  # the messages' foreign key
            added = _chain(session, row.id, None, messages, now)
            row.current_leaf_id = added[-1].id if added else None
        return row

    async def get(self, owner: str, conversation_id: str) -> ConversationRow:
        async with self._session() as session:
            row = await session.get(ConversationRow, conversation_id)
        if row is None or row.owner != owner:
            raise not_found(conversation_id)
        return row

    async def list(self, owner: str, *, after: str | None, limit: int, order: Order) -> Page:
        """Cursor pagination: the page after the conversation `after` (ids sort by creation time)."""
        query = select(ConversationRow).where(ConversationRow.owner == owner)
        return await self._page(query, ConversationRow.id, after, limit, order)

    async def update(self, owner: str, conversation_id: str, *, title: str | None = None,
                     current_leaf_id: str | None = None) -> ConversationRow:
        async with self._session.begin() as session:
            row = await session.get(ConversationRow, conversation_id, with_for_update=True)
            if row is None or row.owner != owner:
                raise not_found(conversation_id)
            if current_leaf_id is not None:
                leaf = await session.get(MessageRow, current_leaf_id)
                if leaf is None or leaf.conversation_id != conversation_id:
                    raise ApiError("message_not_found", f"No message '{current_leaf_id}' in this conversation.",
                                   "current_leaf_id", status=404)
                row.current_leaf_id = current_leaf_id
            if title is not None:
                row.title = title
            row.updated_at = epoch()
        return row

    async def set_metadata(self, owner: str, conversation_id: str, metadata: dict[str, str] | None) -> ConversationRow:
        async with self._session.begin() as session:
            row = await self._owned(session, owner, conversation_id)
            row.conversation_metadata = metadata
            row.updated_at = epoch()
        return row

    async def delete(self, owner: str, conversation_id: str) -> None:
        async with self._session.begin() as session:
            row = await session.get(ConversationRow, conversation_id)
            if row is None or row.owner != owner:
                raise not_found(conversation_id)
            await session.execute(delete(MessageRow).where(MessageRow.conversation_id == conversation_id))
            await session.delete(row)

    async def messages(self, owner: str, conversation_id: str, *, after: str | None, limit: int, order: Order) -> Page:
        """Every message of every branch, in creation order (or the reverse), a page at a time."""
        await self.get(owner, conversation_id)
        query = select(MessageRow).where(MessageRow.conversation_id == conversation_id)
        return await self._page(query, MessageRow.id, after, limit, order)

    async def all_messages(self, conversation_id: str) -> builtins.list[MessageRow]:
        async with self._session() as session:
            result = await session.scalars(select(MessageRow).where(MessageRow.conversation_id == conversation_id)
                                           .order_by(MessageRow.id))
            return list(result)

    async def branch(self, conversation: ConversationRow, leaf_id: str | None = None) -> builtins.list[MessageRow]:
        """The messages from the root to `leaf_id` (default: the conversation's current leaf)."""
        leaf = leaf_id or conversation.current_leaf_id
        if leaf is None:
            return []
        by_id = {row.id: row for row in await self.all_messages(conversation.id)}
        path: builtins.list[MessageRow] = []
        cursor: str | None = leaf
        while cursor is not None and cursor in by_id:
            path.append(by_id[cursor])
            cursor = by_id[cursor].parent_id
        return path[::-1]

    async def append(self, conversation_id: str, parent_id: str | None, messages: builtins.list[NewMessage]) -> None:
        """Add a chain of messages under `parent_id` and make its last one the current leaf."""
        now = epoch()
        async with self._session.begin() as session:
            added = _chain(session, conversation_id, parent_id, messages, now)
            await session.execute(update(ConversationRow).where(ConversationRow.id == conversation_id)
                                  .values(current_leaf_id=added[-1].id if added else parent_id, updated_at=now))

    async def append_to_leaf(self, owner: str, conversation_id: str,
                             messages: builtins.list[NewMessage]) -> builtins.list[MessageRow]:
        """Add a chain of messages under the current leaf (read in the same transaction) and make its last one
        the leaf; the rows added."""
        now = epoch()
        async with self._session.begin() as session:
            row = await self._owned(session, owner, conversation_id)
            added = _chain(session, conversation_id, row.current_leaf_id, messages, now)
            row.current_leaf_id = added[-1].id if added else row.current_leaf_id
            row.updated_at = now
        return added

    async def replace_message(self, owner: str, conversation_id: str, message_id: str,
                              replacements: builtins.list[NewMessage]) -> None:
        """Take a message out of the tree, with `replacements` (a chain, maybe empty) in its place: its
        children then hang under the chain's last message, or under its own parent."""
        now = epoch()
        async with self._session.begin() as session:
            conversation = await self._owned(session, owner, conversation_id)
            row = await session.get(MessageRow, message_id)
            if row is None or row.conversation_id != conversation_id:
                raise ApiError("item_not_found", f"No item '{message_id}' in this conversation.", "item_id",
                               status=404)
            parent_id = row.parent_id
            heir = replacements[-1].id if replacements else parent_id
            await session.delete(row)
            # Its children move before the replacements come: the first of them may take its id.
            await session.execute(update(MessageRow).where(MessageRow.conversation_id == conversation_id,
                                                           MessageRow.parent_id == message_id)
                                  .values(parent_id=heir, updated_at=now))
            await session.flush()
            _chain(session, conversation_id, parent_id, replacements, now)
            if conversation.current_leaf_id == message_id:
                conversation.current_leaf_id = heir
            conversation.updated_at = now

    async def _owned(self, session: Any, owner: str, conversation_id: str) -> ConversationRow:
        row = await session.get(ConversationRow, conversation_id, with_for_update=True)
        if row is None or row.owner != owner:
            raise not_found(conversation_id)
        return cast(ConversationRow, row)

    async def save_message(self, message_id: str, **values: Any) -> None:
        """Write a message's progress or its end (content, status, token counts, latency, error)."""
        async with self._session.begin() as session:
            await session.execute(update(MessageRow).where(MessageRow.id == message_id)
                                  .values(**values, updated_at=epoch()))

    async def _page(self, query: Any, key: Any, after: str | None, limit: int, order: Order) -> Page:
        if after is not None:
            query = query.where(key > after if order == "asc" else key < after)
        query = query.order_by(key.asc() if order == "asc" else key.desc()).limit(limit + 1)
        async with self._session() as session:
            rows = list(await session.scalars(query))
        return Page(rows[:limit], len(rows) > limit)


def _chain(session: Any, conversation_id: str, parent_id: str | None, messages: Sequence[NewMessage],
           now: float) -> builtins.list[MessageRow]:
    """Add `messages` to the session as a chain under `parent_id`; their rows."""
    rows = []
    parent = parent_id
    for message in messages:
        rows.append(MessageRow(id=message.id, conversation_id=conversation_id, parent_id=parent, role=message.role,
                               content=message.content, tool_calls=message.tool_calls,
                               tool_call_id=message.tool_call_id, status=message.status, model=message.model,
                               created_at=now, updated_at=now))
        parent = message.id
    session.add_all(rows)
    return rows
