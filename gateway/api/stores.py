"""What the handlers keep beyond a request: conversations, stored responses, the durable state (client secrets,
idempotent answers, rate-limit buckets), the state replicas share in Redis, the resumable SSE streams, the
responses generating here and the drafts pre-warmed while a user types."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.api.stream_hub import StreamHub
from gateway.generation.prewarm import Prewarmer
from gateway.platform.config import Settings
from gateway.platform.redis_state import RedisState
from gateway.platform.storage.conversations import ConversationStore
from gateway.platform.storage.database import open_database, sqlite_url
from gateway.platform.storage.durable_state import DurableState
from gateway.platform.storage.responses import ResponseStore
from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.generation.response_run import ResponseRun


@dataclass
class Stores:
    settings: Settings
    conversations: ConversationStore | None = None  # opened in the app's lifespan (open)
    stored_responses: ResponseStore | None = None  # the Responses API's (open)
    durable: DurableState | None = None  # client secrets, idempotency, rate limits (open; one replica's)
    shared: RedisState | None = None  # --redis-url: what replicas share (open)
    # Responses generating on this replica, by id: what POST /v1/responses/{id}/cancel stops.
    running_responses: dict[str, ResponseRun] = field(default_factory=dict)
    streams: StreamHub = field(init=False)  # SSE streams, resumable with Last-Event-ID
    prewarmer: Prewarmer = field(default_factory=Prewarmer)  # drafts prefilled while the user types

    def __post_init__(self) -> None:
        self.streams = StreamHub(self.settings.resume_window_s)

    async def open(self) -> None:
        """The database (conversations, responses, durable state) and, with --redis-url, Redis."""
        url = self.settings.database_url or sqlite_url(self.settings.data_dir)
        engine = await open_database(url, shared_by_replicas=bool(self.settings.redis_url))
        self.conversations = ConversationStore(engine)
        self.stored_responses = ResponseStore(engine)
        self.durable = DurableState(engine)
        if self.settings.redis_url:
            self.shared = RedisState(self.settings.redis_url)
            await self.shared.ping()

    @property
    def store(self) -> ConversationStore:
        if self.conversations is None:  # only before the lifespan started: requests come after it
            raise ApiError("storage_unavailable", "The conversation store is not open.", type="server_error", status=503)
        return self.conversations

    @property
    def responses(self) -> ResponseStore:
        if self.stored_responses is None:  # as `store`: only before the lifespan started
            raise ApiError("storage_unavailable", "The response store is not open.", type="server_error", status=503)
        return self.stored_responses

    async def owner_url(self, replica_id: str) -> str | None:
        """Where another replica answers (the Redis directory), or None: this one, unknown, or gone."""
        if replica_id == self.settings.replica_id or self.shared is None:
            return None
        return await self.shared.replica_url(replica_id)

    async def close_streams(self) -> None:
        """The SSE streams and the pre-warms: first at shutdown, with the sessions' timers."""
        await self.streams.close()
        self.prewarmer.close()

    async def close(self) -> None:
        """Last at shutdown, once nothing writes any more: Redis (this replica leaves its directory), then the
        database."""
        if self.shared is not None:
            with contextlib.suppress(Exception):  # Redis may be gone first; the entry then expires by itself
                await self.shared.withdraw_replica(self.settings.replica_id)
            await self.shared.close()
        if self.durable is not None:
            await self.durable.close()
        if self.conversations is not None:
            await self.conversations.close()
