"""A small Realtime client over the plain `websockets` library, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import websockets

from tests.integration.sdk_types import assert_valid_server_event


class RealtimeClient:
    def __init__(self, connection: websockets.ClientConnection, *, validate: bool = True) -> None:
        self.connection = connection
        self.validate = validate  # every event received is checked against the openai SDK's types
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, url: str, *, headers: dict[str, str] | None = None) -> RealtimeClient:
        connection = await websockets.connect(url, additional_headers=headers or {}, max_size=None)
        return cls(connection)

    @classmethod
    async def opened(cls, url: str) -> RealtimeClient:
        """Connected, its session.created received."""
        client = await cls.connect(url)
        assert (await client.recv())["type"] == "session.created"
        return client

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.connection.send(event if isinstance(event, str) else json.dumps(event))

    async def recv(self, timeout: float = 30.0) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.connection.recv(), timeout))
        if self.validate:
            assert_valid_server_event(event)
        event["_received_at"] = time.monotonic()
        self.events.append(event)
        return event

    async def wait_for(self, event_type: str, timeout: float = 60.0) -> dict[str, Any]:
        """Receive until an event of this type arrives (earlier events stay in self.events)."""
        deadline = time.monotonic() + timeout
        while True:
            event = await self.recv(max(0.01, deadline - time.monotonic()))
            if event["type"] == event_type:
                return event

    async def ask(self, text: str, **response: Any) -> dict[str, Any]:
        """Add a user message, create a response, and return its response.done event."""
        await self.send(
            {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
        )
        await self.send({"type": "response.create", "response": response})
        return await self.wait_for("response.done")

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == event_type]

    async def close(self) -> None:
        await self.connection.close()
