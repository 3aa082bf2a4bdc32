"""Which conversation a request to the LLM belongs to, for a backend behind a router (remote.py's
routing header): every request of one conversation carries one key, whatever API it came through.

It is apart from ``conversation_id``, the in-process engine's pin: the engine pins a conversation's KV
under that id until the conversation ends, which only a Realtime session does, and a pre-warm pins under a
name of its own. The HTTP APIs route without pinning by submitting inside :func:`routed`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ROUTING_KEY: ContextVar[str | None] = ContextVar("llm_routing_key", default=None)


@contextmanager
def routed(conversation_id: str | None) -> Iterator[None]:
    """Requests submitted inside carry `conversation_id` as their routing key. Wrap the (synchronous)
    submit or prefill call only: a context variable set across an await or a yield leaks into other work."""
    token = _ROUTING_KEY.set(conversation_id)
    try:
        yield
    finally:
        _ROUTING_KEY.reset(token)


def routing_key(conversation_id: str | None) -> str | None:
    """The key of a request submitted now: the one :func:`routed` set, else its conversation id."""
    return _ROUTING_KEY.get() or conversation_id
