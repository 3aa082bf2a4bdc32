"""/v1/conversations: OpenAI's public Conversations API (`client.conversations`), over the same store as the
ChatGPT-style API (conversations_http.py). A conversation's items are its current branch, root first, as
`gateway/generation/conversation_items.py` maps stored messages to items; added items go under the current
leaf; a deleted item leaves the branch (its children move up to its parent)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gateway.api.caller import AuthorizedCaller, authorized_after
from gateway.api.gate import Caller
from gateway.api.http_bodies import read_json_object
from gateway.api.openapi import error_responses, json_body
from gateway.api.page_query import PageQuery
from gateway.api.services import Services, services
from gateway.generation.conversation_items import StoredItem, items_from_rows, public_item, stored_message, without_item
from gateway.platform.storage.conversations import NewMessage
from gateway.platform.storage.schema import ConversationRow
from gateway.protocol.conversations import (
    CreateConversation,
    CreateItems,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    UpdateConversation,
    parse_body,
)
from gateway.protocol.errors import ApiError
from gateway.safety.policy import SafetyPolicy
from gateway.safety.screening import screen_text

router = APIRouter()
INCLUDE = Query(None, description="Refused: no item has optional fields to include.")


def conversation_object(row: ConversationRow) -> dict[str, Any]:
    return {"id": row.id, "object": "conversation", "created_at": int(row.created_at),
            "metadata": row.conversation_metadata or {}}


def item_list(items: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def _refuse_include(request: Request) -> None:
    """`include` asks for fields (logprobs, image URLs, search results) that no stored item has."""
    for name in ("include", "include[]"):
        if values := request.query_params.getlist(name):
            raise ApiError("invalid_value", f"include is not supported here (no stored item has {values[0]!r}).",
                           "include")


async def _items_page(after: str | None = Query(None, max_length=64, description="The item after which the page "
                                                "starts (the previous page's last_id)."),
                      limit: int = Query(20, ge=1, le=100, description="Items per page (1-100)."),
                      order: Literal["asc", "desc"] = Query("desc", description="desc (the newest first) or asc."),
                      include: list[str] | None = INCLUDE) -> PageQuery:
    """`include` is declared for the docs only: _refuse_include reads it (and `include[]`), after the key."""
    return PageQuery(after, limit, order)


# The page is checked before the key (caller.py's authorized_after).
ItemsPage = Annotated[PageQuery, Depends(_items_page)]
ItemsPageCaller = Annotated[Caller, Depends(authorized_after(_items_page))]


def _new_messages(safety: SafetyPolicy,
                  items: list[MessageItem | FunctionCallItem | FunctionCallOutputItem]) -> list[NewMessage]:
    """The items as stored messages, the user's text and tool outputs screened as chat's are (a refusal names
    the item)."""
    messages = []
    for index, item in enumerate(items):
        wire = item.wire()
        for number, part in enumerate(wire["content"] if wire.get("role") == "user" else ()):
            part["text"] = screen_text(safety, part["text"], what="item",
                                       param=f"items[{index}].content[{number}].text")
        if wire["type"] == "function_call_output":
            wire["output"] = screen_text(safety, wire["output"], what="item", param=f"items[{index}].output")
        messages.append(stored_message(wire, "completed"))
    return messages


async def _items(svc: Services, owner: str, conversation_id: str) -> list[StoredItem]:
    conversation = await svc.stores.store.get(owner, conversation_id)
    return items_from_rows(await svc.stores.store.branch(conversation))


def _find(items: list[StoredItem], item_id: str) -> StoredItem:
    found = next((stored for stored in items if stored.wire["id"] == item_id), None)
    if found is None:
        raise ApiError("item_not_found", f"No item '{item_id}' in this conversation.", "item_id", status=404)
    return found


@router.post("/v1/conversations", openapi_extra=json_body(CreateConversation, required=False),
             responses=error_responses(400, 401, 413, 429))
async def create_conversation(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    svc = services(request)
    body = parse_body(CreateConversation, (await read_json_object(request, empty={}))[1])
    messages = _new_messages(svc.runtime.safety, body.items or [])
    row = await svc.stores.store.create(caller.key_id, metadata=body.metadata, messages=messages)
    return JSONResponse(conversation_object(row), headers=caller.headers)


@router.get("/v1/conversations/{conversation_id}", responses=error_responses(401, 404, 429))
async def get_conversation(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    svc = services(request)
    row = await svc.stores.store.get(caller.key_id, conversation_id)
    return JSONResponse(conversation_object(row), headers=caller.headers)


@router.post("/v1/conversations/{conversation_id}", openapi_extra=json_body(UpdateConversation),
             responses=error_responses(400, 401, 404, 413, 429))
async def update_conversation(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    svc = services(request)
    body = parse_body(UpdateConversation, (await read_json_object(request))[1])
    row = await svc.stores.store.set_metadata(caller.key_id, conversation_id, body.metadata)
    return JSONResponse(conversation_object(row), headers=caller.headers)


@router.delete("/v1/conversations/{conversation_id}", responses=error_responses(401, 404, 429))
async def delete_conversation(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    svc = services(request)
    await svc.stores.store.delete(caller.key_id, conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True},
                        headers=caller.headers)


@router.get("/v1/conversations/{conversation_id}/items", responses=error_responses(400, 401, 404, 429))
async def list_items(request: Request, conversation_id: str, query: ItemsPage, caller: ItemsPageCaller) -> JSONResponse:
    svc = services(request)
    _refuse_include(request)
    items = [public_item(stored) for stored in await _items(svc, caller.key_id, conversation_id)]
    after, limit = query.after, query.limit
    if query.order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        start = next((n + 1 for n, item in enumerate(items) if item["id"] == after), -1)
        if start < 0:
            raise ApiError("invalid_value", f"No item '{after}' in this conversation.", "after")
    page = items[start:start + limit]
    return JSONResponse(item_list(page, has_more=start + limit < len(items)), headers=caller.headers)


@router.post("/v1/conversations/{conversation_id}/items", openapi_extra=json_body(CreateItems),
             responses=error_responses(400, 401, 404, 413, 429))
async def create_items(request: Request, caller: AuthorizedCaller, conversation_id: str,
                       include: list[str] | None = INCLUDE) -> JSONResponse:
    svc = services(request)
    _refuse_include(request)
    body = parse_body(CreateItems, (await read_json_object(request))[1])
    rows = await svc.stores.store.append_to_leaf(caller.key_id, conversation_id,
                                          _new_messages(svc.runtime.safety, body.items))
    return JSONResponse(item_list([public_item(stored) for stored in items_from_rows(rows)]), headers=caller.headers)


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=error_responses(400, 401, 404, 429))
async def get_item(request: Request, caller: AuthorizedCaller, conversation_id: str, item_id: str,
                   include: list[str] | None = INCLUDE) -> JSONResponse:
    svc = services(request)
    _refuse_include(request)
    found = _find(await _items(svc, caller.key_id, conversation_id), item_id)
    return JSONResponse(public_item(found), headers=caller.headers)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=error_responses(400, 401, 404, 429))
async def delete_item(request: Request, caller: AuthorizedCaller, conversation_id: str, item_id: str) -> JSONResponse:
    """The item leaves the branch; the other items of its stored message keep their ids (without_item)."""
    svc = services(request)
    conversation = await svc.stores.store.get(caller.key_id, conversation_id)
    branch = await svc.stores.store.branch(conversation)
    found = _find(items_from_rows(branch), item_id)
    row = next(row for row in branch if row.id == found.message_id)
    if row.status == "in_progress":
        raise ApiError("invalid_value", f"Item '{item_id}' is still being written; delete it once its response "
                       "is done.", "item_id")
    await svc.stores.store.replace_message(caller.key_id, conversation_id, row.id, without_item(row, item_id))
    after = await svc.stores.store.get(caller.key_id, conversation_id)
    return JSONResponse(conversation_object(after), headers=caller.headers)
