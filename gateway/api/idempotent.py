"""A POST with an Idempotency-Key (platform/idempotency.py): the first answer is kept and replayed for the same
key and body. A stream cannot be replayed byte for byte once sent: a retry after it runs again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.services import Services
from gateway.platform.idempotency import StoredResponse


async def idempotent(svc: Services, request: Request, owner: str, body: bytes, headers: dict[str, str],
                     answer: Callable[[], Awaitable[Response]]) -> Response:
    """`answer()`, or the stored answer to the same key and body (`idempotent-replayed: true`); `headers` are
    what a replay carries (the request's own, such as a token reservation's, were for the first)."""
    key = request.headers.get("idempotency-key")
    if not key:
        return await answer()
    stored = await svc.gate.idempotency.begin(owner, key, body)
    if stored is not None:
        return Response(stored.body, stored.status, {**stored.headers, "idempotent-replayed": "true"}, stored.media_type)
    try:
        response = await answer()
    except BaseException:
        await svc.gate.idempotency.finish(owner, key, None)  # failed on our side: the client may retry for real
        raise
    kept = None if isinstance(response, StreamingResponse) else StoredResponse(
        response.status_code, "application/json", bytes(response.body), headers)
    await svc.gate.idempotency.finish(owner, key, kept)
    return response
