"""/v1/responses: OpenAI's Responses API (create, plain or streamed; get, delete, cancel, input_items), each
response owned by the API key that made it. The run itself is generation/response_run.py; a stream is resumable
with Last-Event-ID, as chat's (stream_hub.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.caller import AuthorizedCaller, authorized_after
from gateway.api.gate import Caller
from gateway.api.http_bodies import read_json_object
from gateway.api.idempotent import idempotent
from gateway.api.openapi import error_responses, json_body
from gateway.api.page_query import PageQuery
from gateway.api.services import Services, services
from gateway.api.sse import resume_stream, sse_response, stream_request
from gateway.generation.response_run import ResponseRun
from gateway.protocol.errors import ApiError
from gateway.protocol.response_objects import sse_event, wire
from gateway.protocol.responses import ResponseCreateRequest, parse_response_request

router = APIRouter()
CANCEL_WAIT_S = 10.0  # how long a cancel waits for the response's end to be stored
PAGE_LIMIT = Query(20, ge=1, le=100, description="Items per page (1-100).")
PAGE_AFTER = Query(None, max_length=64, description="The item after which the page starts (the previous page's last_id).")
PAGE_ORDER = Query("desc", description="desc (the last input item first) or asc.")
INCLUDE = Query(None, description="Not served: no includable field is produced.")


async def _refuse_include(include: list[str] | None = INCLUDE) -> None:
    if include:
        raise ApiError("unsupported_parameter", "'include' is not served by this gateway: none of the includable "
                       "fields is produced.", "include")


async def _input_items_page(after: str | None = PAGE_AFTER, limit: int = PAGE_LIMIT,
                            order: Literal["asc", "desc"] = PAGE_ORDER,
                            include: list[str] | None = INCLUDE) -> PageQuery:
    await _refuse_include(include)
    return PageQuery(after, limit, order)


# The query is checked before the key (caller.py's authorized_after).
IncludeCheckedCaller = Annotated[Caller, Depends(authorized_after(_refuse_include))]
InputItemsQuery = Annotated[PageQuery, Depends(_input_items_page)]
InputItemsCaller = Annotated[Caller, Depends(authorized_after(_input_items_page))]


@router.post("/v1/responses", openapi_extra=json_body(ResponseCreateRequest),
             responses=error_responses(400, 401, 404, 413, 429, 503))
async def create_response(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    if (resumed := await resume_stream(svc, request, caller)) is not None:
        return resumed
    raw, payload = await read_json_object(request)
    body = parse_response_request(payload)
    svc.runtime.require_model(body.model)
    return await idempotent(svc, request, caller.key_id, raw, caller.headers,
                            lambda: _respond(svc, request, body, caller.key_id, caller.headers))


async def _respond(svc: Services, request: Request, body: ResponseCreateRequest, owner: str,
                   headers: dict[str, str]) -> Response:
    run = await ResponseRun.prepare(svc.run_deps(owner), body, owner)
    if run.reservation_headers:
        headers = {**headers, **run.reservation_headers}
    if body.store is not False:
        svc.stores.running_responses[run.state.id] = run
    if body.stream:
        # Produced in a task of its own, readable again with Last-Event-ID (stream_hub.py); one whose items go
        # into a conversation runs to its end without its client, as a chat completion's does.
        buffer = svc.stores.streams.start(run.state.id, owner, _sse(svc, run), request=await stream_request(request),
                                   runs_to_end=body.conversation is not None)
        return sse_response(svc.stores.streams.read(buffer), headers)
    try:
        async for _ in run.events():
            pass
    finally:
        svc.stores.running_responses.pop(run.state.id, None)
    if run.failure is not None:  # not streamed: the client is told by the status, as for chat
        raise run.failure
    return JSONResponse(wire(run.state.object()), headers=headers)


async def _sse(svc: Services, run: ResponseRun) -> AsyncIterator[bytes]:
    try:
        async for event in run.events():
            yield sse_event(event)
    finally:
        svc.stores.running_responses.pop(run.state.id, None)


@router.get("/v1/responses/{response_id}", responses=error_responses(400, 401, 404, 429))
async def get_response(request: Request, response_id: str, caller: IncludeCheckedCaller) -> JSONResponse:
    svc = services(request)
    row = await svc.stores.responses.get(caller.key_id, response_id)
    return JSONResponse(row.body, headers=caller.headers)


@router.delete("/v1/responses/{response_id}", responses=error_responses(401, 404, 429))
async def delete_response(request: Request, caller: AuthorizedCaller, response_id: str) -> JSONResponse:
    svc = services(request)
    run = svc.stores.running_responses.get(response_id)
    if run is not None and run.owner == caller.key_id:
        run.cancel()  # a response deleted while it runs stops
    await svc.stores.responses.delete(caller.key_id, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True}, headers=caller.headers)


@router.post("/v1/responses/{response_id}/cancel", responses=error_responses(400, 401, 404, 429))
async def cancel_response(request: Request, caller: AuthorizedCaller, response_id: str) -> JSONResponse:
    """Stops a stored response while it generates on this replica (streamed or not) and returns it, cancelled.
    OpenAI cancels background responses only, which are not served here; a response that has ended is a 400."""
    svc = services(request)
    run = svc.stores.running_responses.get(response_id)
    if run is None or run.owner != caller.key_id:
        row = await svc.stores.responses.get(caller.key_id, response_id)  # 404 when there is none
        raise ApiError("response_not_in_progress", f"Response '{response_id}' is {row.status}: only a response "
                       "still generating (on this replica) can be cancelled.", "response_id")
    run.cancel()
    with contextlib.suppress(TimeoutError):  # its end is stored at once; bounded, as nothing else must hold it
        await asyncio.wait_for(run.ended.wait(), CANCEL_WAIT_S)
    return JSONResponse(wire(run.state.object()), headers=caller.headers)


@router.get("/v1/responses/{response_id}/input_items", responses=error_responses(400, 401, 404, 429))
async def list_input_items(request: Request, response_id: str, query: InputItemsQuery,
                           caller: InputItemsCaller) -> JSONResponse:
    svc = services(request)
    page = await svc.stores.responses.input_items(caller.key_id, response_id, after=query.after, limit=query.limit,
                                                  order=query.order)
    data: list[dict[str, Any]] = list(page.rows)
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": page.has_more},
                        headers=caller.headers)
