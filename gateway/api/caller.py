"""The one FastAPI dependency for a handler's caller: authenticated and rate-limited (401, 429) before the
handler runs, its answer to carry `caller.headers` (the rate-limit headers)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from gateway.api.gate import Caller
from gateway.api.services import services
from gateway.platform.auth import bearer_token


async def authorized_caller(request: Request) -> Caller:
    """An API key's caller (a client secret is refused: it opens a Realtime session only)."""
    return await services(request).gate.authorize(bearer_token(request.headers.get("authorization")))


async def caller_or_client_secret(request: Request) -> Caller:
    """An API key's caller, or a client secret's: only looked up here, spent when its session opens."""
    return await services(request).gate.authorize(bearer_token(request.headers.get("authorization")),
                                                  allow_ephemeral=True)


def authorized_after(checks: Callable[..., object], *, allow_ephemeral: bool = False
                     ) -> Callable[[Request, object], Awaitable[Caller]]:
    """authorized_caller (caller_or_client_secret with `allow_ephemeral`), once `checks` passed: the query an
    endpoint declares in `checks` (a dependency) is checked before the key, as it was when it was the endpoint's
    own (FastAPI validates those after the dependencies): a bad query is a 422 (or its 400) whatever the key,
    and costs no request of its limit."""
    authorize = caller_or_client_secret if allow_ephemeral else authorized_caller

    async def caller(request: Request, _: object = Depends(checks)) -> Caller:
        return await authorize(request)

    return caller


AuthorizedCaller = Annotated[Caller, Depends(authorized_caller)]
CallerOrClientSecret = Annotated[Caller, Depends(caller_or_client_secret)]
