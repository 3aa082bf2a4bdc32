"""The ChatGPT-style conversation API, under /backend-api/ as ChatGPT's web client calls it: stored conversations
(trees of messages), each owned by the API key that made it. conversation_items_http.py serves the same store
as OpenAI's public Conversations API (/v1/conversations)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.api.caller import AuthorizedCaller, authorized_after
from gateway.api.gate import Caller
from gateway.api.http_bodies import read_json_object
from gateway.api.openapi import error_responses, json_body
from gateway.api.page_query import PageQuery
from gateway.api.services import services
from gateway.platform.storage.conversations import Page
from gateway.platform.storage.schema import ConversationRow, MessageRow
from gateway.protocol.validation import api_error_from_validation

router = APIRouter()
PAGE_LIMIT = Query(20, ge=1, le=100, description="Items per page (1-100).")
PAGE_AFTER = Query(None, max_length=64, description="The id after which the page starts (the previous page's last_id).")
PAGE_ORDER = Query("desc", description="By creation time: desc (newest first) or asc.")


async def _conversations_page(after: str | None = PAGE_AFTER, limit: int = PAGE_LIMIT,
                              order: Literal["asc", "desc"] = PAGE_ORDER) -> PageQuery:
    return PageQuery(after, limit, order)


async def _messages_page(after: str | None = PAGE_AFTER, limit: int = PAGE_LIMIT,
                         order: Literal["asc", "desc"] = Query("asc")) -> PageQuery:
    return PageQuery(after, limit, order)


async def _all_branches(all_branches: bool = Query(False, description="Every message, not only the current branch.")
                        ) -> bool:
    return all_branches


# Each query is checked before the key (caller.py's authorized_after).
ConversationsPage = Annotated[PageQuery, Depends(_conversations_page)]
ConversationsPageCaller = Annotated[Caller, Depends(authorized_after(_conversations_page))]
MessagesPage = Annotated[PageQuery, Depends(_messages_page)]
MessagesPageCaller = Annotated[Caller, Depends(authorized_after(_messages_page))]
AllBranches = Annotated[bool, Depends(_all_branches)]
AllBranchesCaller = Annotated[Caller, Depends(authorized_after(_all_branches))]


class CreateBackendConversation(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    title: str | None = Field(None, max_length=256)


class UpdateBackendConversation(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    title: str | None = Field(None, min_length=1, max_length=256)
    current_leaf_id: str | None = Field(None, max_length=64, description="The message whose branch is current.")

    @model_validator(mode="after")
    def _something_to_change(self) -> UpdateBackendConversation:
        if self.title is None and self.current_leaf_id is None:
            raise ValueError("give title or current_leaf_id")
        return self


def conversation_object(row: ConversationRow) -> dict[str, Any]:
    return {"id": row.id, "object": "conversation", "title": row.title, "current_leaf_id": row.current_leaf_id,
            "created_at": int(row.created_at), "updated_at": int(row.updated_at)}


def message_object(row: MessageRow) -> dict[str, Any]:
    usage = None
    if row.output_tokens is not None:
        usage = {"input_tokens": row.input_tokens, "cached_tokens": row.cached_tokens, "output_tokens": row.output_tokens}
    return {"id": row.id, "object": "conversation.message", "conversation_id": row.conversation_id,
            "parent_id": row.parent_id, "role": row.role, "content": row.content, "tool_calls": row.tool_calls,
            "tool_call_id": row.tool_call_id, "status": row.status, "model": row.model, "usage": usage,
            "latency": row.latency, "metadata": row.message_metadata, "error": row.error, "created_at": int(row.created_at),
            "updated_at": int(row.updated_at)}


def list_object(page: Page, render: Any) -> dict[str, Any]:
    data = [render(row) for row in page.rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}


async def _body(request: Request, model: type[BaseModel], empty: dict[str, Any] | None = None) -> Any:
    _, payload = await read_json_object(request, empty=empty)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None


@router.post("/backend-api/conversations", openapi_extra=json_body(CreateBackendConversation, required=False),
             responses=error_responses(400, 401, 413, 429))
async def create_conversation(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    svc = services(request)
    body: CreateBackendConversation = await _body(request, CreateBackendConversation, empty={})
    row = await svc.stores.store.create(caller.key_id, body.title)
    return JSONResponse(conversation_object(row), headers=caller.headers)


@router.get("/backend-api/conversations", responses=error_responses(400, 401, 429))
async def list_conversations(request: Request, query: ConversationsPage,
                             caller: ConversationsPageCaller) -> JSONResponse:
    svc = services(request)
    page = await svc.stores.store.list(caller.key_id, after=query.after, limit=query.limit, order=query.order)
    return JSONResponse(list_object(page, conversation_object), headers=caller.headers)


@router.get("/backend-api/conversation/{conversation_id}", responses=error_responses(400, 401, 404, 429))
async def get_conversation(request: Request, conversation_id: str, all_branches: AllBranches,
                           caller: AllBranchesCaller) -> JSONResponse:
    svc = services(request)
    row = await svc.stores.store.get(caller.key_id, conversation_id)
    messages = await (svc.stores.store.all_messages(row.id) if all_branches else svc.stores.store.branch(row))
    return JSONResponse({**conversation_object(row), "messages": [message_object(m) for m in messages]},
                        headers=caller.headers)


@router.patch("/backend-api/conversation/{conversation_id}", openapi_extra=json_body(UpdateBackendConversation),
              responses=error_responses(400, 401, 404, 413, 429))
async def update_conversation(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    svc = services(request)
    body: UpdateBackendConversation = await _body(request, UpdateBackendConversation)
    row = await svc.stores.store.update(caller.key_id, conversation_id, title=body.title,
                                 current_leaf_id=body.current_leaf_id)
    return JSONResponse(conversation_object(row), headers=caller.headers)


@router.delete("/backend-api/conversation/{conversation_id}", responses=error_responses(401, 404, 429))
async def delete_conversation(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    svc = services(request)
    await svc.stores.store.delete(caller.key_id, conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True},
                        headers=caller.headers)


@router.get("/backend-api/conversation/{conversation_id}/messages", responses=error_responses(400, 401, 404, 429))
async def list_messages(request: Request, conversation_id: str, query: MessagesPage,
                        caller: MessagesPageCaller) -> JSONResponse:
    svc = services(request)
    page = await svc.stores.store.messages(caller.key_id, conversation_id, after=query.after, limit=query.limit,
                                           order=query.order)
    return JSONResponse(list_object(page, message_object), headers=caller.headers)
