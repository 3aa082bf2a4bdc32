"""Idempotency-Key on POST: a retried request gets the first answer again instead of a second run."""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.platform.redis_state import RedisState
    from gateway.platform.storage.durable_state import DurableState
    from gateway.platform.storage.schema import IdempotencyRow

MAX_KEY_CHARS = 256


@dataclass
class StoredResponse:
    status: int
    media_type: str
    body: bytes
    headers: dict[str, str]


@dataclass
class _Entry:
    fingerprint: str
    created: float
    response: StoredResponse | None = None  # None while the first request is still running


@dataclass
class IdempotencyStore:
    ttl_s: float
    max_entries: int = 10_000
    _entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    journal: DurableState | None = None  # writes the answers behind us, so that they survive a restart
    shared: RedisState | None = None  # --redis-url: the records live there, so a retry on another replica replays

    def restore(self, rows: list[IdempotencyRow]) -> None:
        for row in sorted(rows, key=lambda row: row.created_at)[-self.max_entries:]:
            response = StoredResponse(row.status, row.media_type, row.body, dict(row.headers))
            self._entries[(row.owner, row.key)] = _Entry(row.fingerprint, row.created_at, response)

    async def begin(self, caller: str, key: str, body: bytes) -> StoredResponse | None:
        """The stored answer for a replay, None for a first request (which must then `finish`)."""
        if len(key) > MAX_KEY_CHARS:
            raise ApiError("invalid_value", f"An Idempotency-Key has at most {MAX_KEY_CHARS} characters.",
                           "Idempotency-Key")
        fingerprint = hashlib.sha256(body).hexdigest()
        if self.shared is not None:
            found = await self.shared.begin_idempotent(caller, _key_digest(key), fingerprint, time.time(), self.ttl_s)
            if found is None:
                return None
            answer = found.get("response")
            shared_entry = _Entry(found["fingerprint"], found["created"], None if answer is None else StoredResponse(
                answer["status"], answer["media_type"], base64.b64decode(answer["body"]), answer["headers"]))
            return self._replay(shared_entry, fingerprint)
        self._expire()
        entry = self._entries.get((caller, key))
        if entry is None:
            if len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            self._entries[(caller, key)] = _Entry(fingerprint=fingerprint, created=time.time())
            return None
        return self._replay(entry, fingerprint)

    @staticmethod
    def _replay(entry: _Entry, fingerprint: str) -> StoredResponse:
        if entry.fingerprint != fingerprint:
            raise ApiError(
                "idempotency_key_reused", "This Idempotency-Key was used with a different request body.", "Idempotency-Key", status=422
            )
        if entry.response is None:
            raise ApiError(
                "idempotency_key_in_use", "A request with this Idempotency-Key is still in progress.", "Idempotency-Key", status=409
            )
        return entry.response

    async def finish(self, caller: str, key: str, response: StoredResponse | None) -> None:
        """Store the answer; None (the request failed on our side) lets the client retry for real."""
        if self.shared is not None:
            answer = None if response is None else {
                "status": response.status, "media_type": response.media_type,
                "body": base64.b64encode(response.body).decode(), "headers": response.headers}
            await self.shared.finish_idempotent(caller, _key_digest(key), answer)
            return
        if response is None:
            self._entries.pop((caller, key), None)
            return
        entry = self._entries.get((caller, key))
        if entry is not None:
            entry.response = response
            if self.journal is not None:
                self.journal.response_stored(caller, key, entry.fingerprint, entry.created, response.status,
                                             response.media_type, response.body, response.headers)

    def _expire(self) -> None:
        horizon = time.time() - self.ttl_s
        for key in [key for key, entry in self._entries.items() if entry.created < horizon]:
            del self._entries[key]


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
