"""What the HTTP and WebSocket handlers share: the settings, the models, and three parts, each with one job:
the gate (auth, rate limits, token quota, idempotency: gate.py), the live sessions (session_registry.py) and
the stores (stores.py). Services holds them, and opens and closes them in the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from gateway.api.gate import Gate
from gateway.api.session_registry import SessionRegistry
from gateway.api.stores import Stores
from gateway.generation.memory import MemoryAccount, MemoryStore
from gateway.generation.reply_path import RunDeps
from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.platform.redis_state import REPLICA_TTL_S
from gateway.platform.token_quota import TokenAccount

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    gate: Gate
    stores: Stores
    sessions: SessionRegistry

    @classmethod
    def create(cls, settings: Settings, runtime: Runtime | None = None) -> Services:
        runtime = runtime or Runtime(settings)
        gate, stores = Gate.create(settings), Stores(settings)
        return cls(settings, runtime, gate, stores, SessionRegistry(settings, runtime.admission, gate, stores))

    def memory(self, owner: str) -> MemoryAccount:
        """`owner`'s memory (recalled from only when the key turned it on)."""
        return MemoryAccount(MemoryStore(self.stores.store.engine), owner)

    def run_deps(self, owner: str) -> RunDeps:
        """What a chat completion or a response of `owner`'s draws on (a delegated Live task's too:
        live_factory.py); 503 until the model is loaded."""
        settings = self.settings
        return RunDeps(self.runtime.generator(), self.stores.store, self.stores.responses,
                       TokenAccount(self.gate.quota, owner), self.memory(owner), settings.default_max_tokens,
                       settings.repetition_penalty, settings.model_name)

    async def open(self) -> None:
        """The lifespan's start: the stores open, and the gate and the seats keep their state in them (Redis,
        for every replica, or this replica's database)."""
        stores = self.stores
        await stores.open()
        assert stores.durable is not None
        if stores.shared is not None:
            self.gate.share(stores.shared)
            self.sessions.seats.shared = stores.shared
            self.sessions.in_background(self.sessions.seats.keep_alive(), "session seats")
        else:
            self.gate.restore(await stores.durable.load(self.settings.idempotency_ttl_s), stores.durable)
        self._announce_replica()

    def _announce_replica(self) -> None:
        """With Redis and --replica-url: keep this replica in the directory that other replicas forward by,
        refreshed well within its entry's expiry (a background task, cancelled at shutdown)."""
        shared, url = self.stores.shared, self.settings.replica_url
        if shared is None or url is None:
            return

        async def refresh() -> None:
            while True:
                try:
                    await shared.announce_replica(self.settings.replica_id, url)
                except Exception as exc:  # Redis away for a moment: the next refresh tries again
                    log.warning("announcing replica %s failed: %s", self.settings.replica_id, exc)
                await asyncio.sleep(REPLICA_TTL_S / 3)

        self.sessions.in_background(refresh(), "replica announcer")

    async def close(self) -> None:
        """The lifespan's end (the models are freed after): timers first, then the sessions and the background
        tasks, then the stores, once nothing writes to them."""
        await self.sessions.stop_timers()
        await self.stores.close_streams()
        await self.sessions.close()
        await self.stores.close()


def services(holder: HTTPConnection | Starlette) -> Services:
    """The app's services, from the app itself, a request or a WebSocket."""
    app = holder if isinstance(holder, Starlette) else holder.app
    return app.state.services  # type: ignore[no-any-return]
