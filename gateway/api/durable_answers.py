"""An answer never tells a client about a change that a kill -9 could still undo.

A handler that makes such a change (a client secret minted or spent, an Idempotency-Key answer) does it
synchronously in memory; the journal (platform/storage/durable_state.py) starts its commit at once and
registers it with `hold_answer` (platform/storage/answer_holds.py). `DurableAnswers`, an ASGI middleware,
holds the request's answer until those commits are done: an HTTP response's start, or a WebSocket's next event (a Realtime session's `session.created`
after its secret is spent). Requests that changed nothing durable pass straight through.

If a commit fails, the client is not told that the change happened: an HTTP request gets 503
`storage_unavailable` instead of its answer, a WebSocket is closed by its writer (1011).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.http_errors import error_response
from gateway.platform.storage.answer_holds import NotDurable, committed, holding
from gateway.protocol.errors import ApiError


class DurableAnswers:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        pending: list[asyncio.Future[bool]] = []
        replaced = False  # an HTTP answer was replaced by a 503: the rest of its body is dropped

        async def held(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return
            if pending and message["type"] in ("http.response.start", "websocket.send") and not await committed(pending):
                if message["type"] == "websocket.send":
                    raise NotDurable("the session's client secret could not be spent durably")
                replaced = True
                error = ApiError("storage_unavailable", "The change could not be stored; retry shortly.",
                                 type="server_error", status=503, retry_after_s=1.0)
                await error_response(error)(scope, receive, send)
                return
            await send(message)

        with holding(pending):
            await self.app(scope, receive, held)
