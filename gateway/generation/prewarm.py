"""Pre-warm while the user types: the conversation plus the draft go into the engine's prefix cache at
background priority, so the message's reply starts from cached KV.

Bounded: a key has at most PREPARES_PER_KEY prefills in flight (a new draft of the same conversation
replaces the previous one), the engine runs background work only when no live request waits and one at
a time, and a prepared prefix stays pinned for PIN_S at most. A key keeps at most PINNED_PER_KEY
prepared prefixes pinned: a new one unpins the key's oldest finished one, so that one key's storm of
prepares cannot pin the cache full and push out the prefixes other keys prepared.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.protocol.errors import ApiError
from inference.llm.backend import LLMBackend
from inference.llm.routing import routed

PREPARES_PER_KEY = 2
PINNED_PER_KEY = 4  # in flight or finished; more than PREPARES_PER_KEY, so a finished one can always go
PIN_S = 60.0


@dataclass(eq=False)
class _Prepared:
    prompt_ids: list[int]
    prefill: asyncio.Future[int]
    unpin: asyncio.TimerHandle | None = None


class Prewarmer:
    def __init__(self) -> None:
        self._prepared: dict[tuple[str, str], _Prepared] = {}  # (key, conversation) -> its newest draft

    @staticmethod
    def _pin_name(conversation_id: str) -> str:
        return f"prepare:{conversation_id}"

    def prepare(self, engine: LLMBackend, owner: str, conversation_id: str, prompt_ids: list[int]) -> None:
        self._drop(engine, owner, conversation_id)
        in_flight = sum(1 for (key, _), p in self._prepared.items() if key == owner and not p.prefill.done())
        if in_flight >= PREPARES_PER_KEY:
            raise ApiError("too_many_prepares", f"This key has {in_flight} prepares running; wait for one to finish.",
                           type="rate_limit_error", status=429, retry_after_s=1.0)
        mine = [(conversation, p) for (key, conversation), p in self._prepared.items() if key == owner]
        finished = [conversation for conversation, p in mine if p.prefill.done()]  # oldest first
        for oldest in finished[: max(0, len(mine) + 1 - PINNED_PER_KEY)]:
            self._drop(engine, owner, oldest)
        with routed(conversation_id):  # pinned apart from the conversation, routed with it (to the same worker)
            prefill = engine.prefill(prompt_ids, conversation_id=self._pin_name(conversation_id), background=True)
        prefill.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed pre-warm is only a miss
        prepared = _Prepared(prompt_ids, prefill)
        prepared.unpin = asyncio.get_running_loop().call_later(PIN_S, self._drop, engine, owner, conversation_id)
        self._prepared[(owner, conversation_id)] = prepared

    def prepared_tokens(self, owner: str, conversation_id: str, prompt_ids: list[int]) -> int:
        """How many of `prompt_ids` a finished prepare of this conversation computed (0: none)."""
        prepared = self._prepared.get((owner, conversation_id))
        if prepared is None or not prepared.prefill.done() or prepared.prefill.cancelled() or prepared.prefill.exception():
            return 0
        common = 0
        for mine, theirs in zip(prompt_ids, prepared.prompt_ids, strict=False):
            if mine != theirs:
                break
            common += 1
        return min(common, len(prompt_ids) - 1)  # the last prompt token is always computed

    def release(self, engine: LLMBackend, owner: str, conversation_id: str) -> None:
        """The message came: its reply's KV now extends the prefix, which no longer needs a pin."""
        self._drop(engine, owner, conversation_id)

    def _drop(self, engine: LLMBackend, owner: str, conversation_id: str) -> None:
        prepared = self._prepared.pop((owner, conversation_id), None)
        if prepared is None:
            return
        if prepared.unpin is not None:
            prepared.unpin.cancel()
        prepared.prefill.cancel()
        engine.end_conversation(self._pin_name(conversation_id))

    def close(self) -> None:
        for prepared in self._prepared.values():
            if prepared.unpin is not None:
                prepared.unpin.cancel()
            prepared.prefill.cancel()
        self._prepared.clear()
