"""Which durable commits the current request's answer waits for (see gateway/api/durable_answers.py).

A handler that makes a change a kill -9 could undo (a client secret minted or spent, an Idempotency-Key
answer) does it in memory; the journal (durable_state.py) starts its commit at once and registers it
here with `hold_answer`. The API's middleware opens a hold for each request and waits for what was
registered before the answer goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# The commits the current request waits for (each resolves to whether it succeeded); None outside a request.
_pending: ContextVar[list[asyncio.Future[bool]] | None] = ContextVar("durable_commits", default=None)


class NotDurable(RuntimeError):
    """A change the answer announces could not be committed."""


def hold_answer(commit: asyncio.Future[bool]) -> None:
    """The current request's answer waits for `commit` (outside a request: nothing waits)."""
    pending = _pending.get()
    if pending is not None and commit not in pending:
        pending.append(commit)


@contextlib.contextmanager
def holding(pending: list[asyncio.Future[bool]]) -> Iterator[None]:
    """Within it, `hold_answer` registers the commits in `pending` (one request's)."""
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)


async def committed(pending: list[asyncio.Future[bool]]) -> bool:
    """Waits for the registered commits; whether all succeeded (and forgets them)."""
    futures = list(pending)
    pending.clear()
    await asyncio.wait(futures)  # not `await future`: a client that leaves must not cancel a shared commit
    return all(future.result() for future in futures)
