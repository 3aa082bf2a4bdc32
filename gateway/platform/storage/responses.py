"""Stored responses of the Responses API, owned by API keys: each row is the response object as the API
returns it and the input items it was given (what `previous_response_id` carries on, with its output).
Every method is one transaction, on the asyncio drivers (nothing blocks the event loop)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.platform.storage.conversations import Order, Page
from gateway.platform.storage.schema import ResponseRow, epoch
from gateway.protocol.errors import ApiError

MAX_CHAIN = 1000  # most responses a previous_response_id chain is followed through (a guard against a cycle)


def response_not_found(response_id: str, param: str = "response_id") -> ApiError:
    # Another key's response, or one created with store=false, is "not found" too.
    return ApiError("response_not_found", f"No response '{response_id}'.", param, status=404)


class ResponseStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._session = async_sessionmaker(engine, expire_on_commit=False)

    async def create(self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Store a new response (`body` is the object as returned; its id is the row's)."""
        now = epoch()
        async with self._session.begin() as session:
            session.add(ResponseRow(id=body["id"], owner=owner, previous_response_id=body.get("previous_response_id"),
                                    conversation_id=(body.get("conversation") or {}).get("id"), status=body["status"],
                                    body=body, input_items=input_items, created_at=now, updated_at=now))

    async def save(self, body: dict[str, Any]) -> None:
        """Write a stored response's new state; one deleted meanwhile stays deleted."""
        async with self._session.begin() as session:
            await session.execute(update(ResponseRow).where(ResponseRow.id == body["id"])
                                  .values(status=body["status"], body=body, updated_at=epoch()))

    async def get(self, owner: str, response_id: str, param: str = "response_id") -> ResponseRow:
        async with self._session() as session:
            row = await session.get(ResponseRow, response_id)
        if row is None or row.owner != owner:
            raise response_not_found(response_id, param)
        return row

    async def chain(self, owner: str, response_id: str) -> list[ResponseRow]:
        """The response and those before it (previous_response_id), oldest first."""
        rows: list[ResponseRow] = []
        cursor: str | None = response_id
        while cursor is not None and len(rows) < MAX_CHAIN:
            row = await self.get(owner, cursor, "previous_response_id")
            rows.append(row)
            cursor = row.previous_response_id
        return rows[::-1]

    async def delete(self, owner: str, response_id: str) -> None:
        async with self._session.begin() as session:
            row = await session.get(ResponseRow, response_id)
            if row is None or row.owner != owner:
                raise response_not_found(response_id)
            await session.execute(delete(ResponseRow).where(ResponseRow.id == response_id))

    async def input_items(self, owner: str, response_id: str, *, after: str | None, limit: int,
                          order: Order) -> Page:
        """A response's input items, a page at a time after the item `after` (in the given order)."""
        items = list((await self.get(owner, response_id)).input_items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise ApiError("invalid_value", f"No input item '{after}' in this response.", "after")
            items = items[ids.index(after) + 1:]
        return Page(items[:limit], len(items) > limit)
