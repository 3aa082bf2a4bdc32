"""HTTP request bodies: one size limit for every endpoint, enforced as they stream, and the JSON reader.

The limit is a pure ASGI middleware, so no endpoint can forget it: a declared Content-Length over it
is answered before the app runs, and a streamed (chunked) body is cut off at the first message past
it, before the endpoint reads more. An endpoint may hold a smaller limit of its own (`read_body`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.http_errors import error_response
from gateway.protocol.errors import ApiError
from gateway.protocol.json_input import decode_json
from gateway.protocol.validation import api_error_from_validation


def too_large(limit: int) -> ApiError:
    # The rest of the body is not read: the connection cannot carry another request after it.
    return ApiError(
        "request_too_large", f"The request body exceeds the {limit}-byte limit.", status=413, headers={"connection": "close"}
    )


def declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodySizeLimit:
    """Refuses every HTTP body over `max_bytes` with 413 and OpenAI's error body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await error_response(too_large(self.max_bytes))(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)  # answered by the app's ApiError handler
            return message

        await self.app(scope, counted, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit`: an endpoint's own, smaller one."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request, *, empty: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The body (bounded by BodySizeLimit) and its JSON object; `empty` stands for an empty body when given."""
    body = await request.body()
    if not body and empty is not None:
        return body, dict(empty)
    payload = decode_json(body)
    if not isinstance(payload, dict):
        raise ApiError("invalid_request", "The request body must be a JSON object.")
    return body, payload


ModelT = TypeVar("ModelT", bound=BaseModel)


async def read_model(request: Request, model: type[ModelT]) -> ModelT:
    """The body as `model`: bad JSON or a field that does not validate is a 400 naming it."""
    _, payload = await read_json_object(request)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
