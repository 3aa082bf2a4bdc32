"""/v1/memories: what memory (gateway/generation/memory.py) keeps for the calling API key, its switch, and its erasure."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import services
from gateway.generation.memory import MemoryStore
from gateway.platform.storage.schema import MemoryRow

router = APIRouter()


class MemorySettings(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    enabled: bool


def memory_object(row: MemoryRow) -> dict[str, Any]:
    return {"id": row.id, "object": "memory", "content": row.content, "created_at": int(row.created_at)}


def _store(request: Request) -> MemoryStore:
    return MemoryStore(services(request).stores.store.engine)


@router.get("/v1/memories", responses=error_responses(401, 429))
async def list_memories(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    """Every memory of the key, newest first, and whether memory is on."""
    store, owner = _store(request), caller.key_id
    rows = await store.list(owner)
    return JSONResponse({"object": "list", "enabled": await store.enabled(owner),
                         "data": [memory_object(row) for row in rows]}, headers=caller.headers)


@router.delete("/v1/memories", responses=error_responses(401, 429))
async def delete_memories(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    """Erase every memory of the key (memory stays on or off as it was)."""
    store, owner = _store(request), caller.key_id
    return JSONResponse({"object": "memory.deleted", "deleted": await store.delete_all(owner)}, headers=caller.headers)


@router.delete("/v1/memories/{memory_id}", responses=error_responses(401, 404, 429))
async def delete_memory(request: Request, caller: AuthorizedCaller, memory_id: str) -> JSONResponse:
    store, owner = _store(request), caller.key_id
    await store.delete(owner, memory_id)
    return JSONResponse({"id": memory_id, "object": "memory.deleted", "deleted": True}, headers=caller.headers)


@router.get("/v1/memories/settings", responses=error_responses(401, 429))
async def get_settings(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    store, owner = _store(request), caller.key_id
    return JSONResponse({"object": "memory.settings", "enabled": await store.enabled(owner)}, headers=caller.headers)


@router.post("/v1/memories/settings", openapi_extra=json_body(MemorySettings),
             responses=error_responses(400, 401, 413, 429))
async def set_settings(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    """{"enabled": true} turns memory on for the key; false turns it off (what it keeps stays until deleted)."""
    store, owner = _store(request), caller.key_id
    body = await read_model(request, MemorySettings)
    await store.set_enabled(owner, body.enabled)
    return JSONResponse({"object": "memory.settings", "enabled": body.enabled}, headers=caller.headers)
