"""An answer never tells a client about a change that a kill -9 could still undo.

A handler that makes such a change (a client secret minted or spent, an Idempotency-Key answer) does it
synchronously in memory; the journal (durable_state.py) starts its commit at once and registers it here
with `hold_answer`. `DurableAnswers`, an ASGI middleware, holds the request's answer until those commits
are done: an HTTP response's start, or a WebSocket's next event (a Realtime session's `session.created`
after its secret is spent). Requests that changed nothing durable pass straight through.

If a commit fails, the client is not told that the change happened: an HTTP request gets 503
`storage_unavailable` instead of its answer, a WebSocket is closed by its writer (1011).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http_errors import error_response
from gateway.protocol.errors import ApiError

# The commits the current request waits for (each resolves to whether it succeeded); None outside a request.
_pending: ContextVar[list[asyncio.Future[bool]] | None] = ContextVar("durable_commits", default=None)


class NotDurable(RuntimeError):
    """A change the answer announces could not be committed."""


def hold_answer(commit: asyncio.Future[bool]) -> None:
    """The current request's answer waits for `commit` (outside a request: nothing waits)."""
    pending = _pending.get()
    if pending is not None and commit not in pending:
        pending.append(commit)


async def _committed(pending: list[asyncio.Future[bool]]) -> bool:
    futures = list(pending)
    pending.clear()
    await asyncio.wait(futures)  # not `await future`: a client that leaves must not cancel a shared commit
    return all(future.result() for future in futures)


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
            if pending and message["type"] in ("http.response.start", "websocket.send") and not await _committed(pending):
                if message["type"] == "websocket.send":
                    raise NotDurable("the session's client secret could not be spent durably")
                replaced = True
                error = ApiError("storage_unavailable", "The change could not be stored; retry shortly.",
                                 type="server_error", status=503, retry_after_s=1.0)
                await error_response(error)(scope, receive, send)
                return
            await send(message)

        token = _pending.set(pending)
        try:
            await self.app(scope, receive, held)
        finally:
            _pending.reset(token)
