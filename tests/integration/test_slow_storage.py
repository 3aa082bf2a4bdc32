"""A slow database never delays a token: the gateway runs in this process (so that the store can be
slowed down), on a real SQLite file whose every write first waits SLOW_S; a streamed chat completion
attached to a conversation still streams at the engine's pace, and its reply is stored behind it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.api.app import build_app
from gateway.platform.config import Settings
from gateway.platform.processes import free_port
from gateway.platform.storage.conversations import ConversationStore
from tests.integration.conftest import MODEL

SLOW_S = 3.0


@pytest.fixture
async def slow_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    for name in ("append", "save_message"):
        write = getattr(ConversationStore, name)

        async def slow(self: ConversationStore, *args: Any, _write: Any = write, **kwargs: Any) -> None:
            await asyncio.sleep(SLOW_S)  # a disk that takes its time (the event loop is free meanwhile)
            await _write(self, *args, **kwargs)

        monkeypatch.setattr(ConversationStore, name, slow)
    settings = Settings(port=free_port(), data_dir=tmp_path / "data", load_voice_models=False)
    server = uvicorn.Server(uvicorn.Config(build_app(settings), host="127.0.0.1", port=settings.port,
                                           log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{settings.port}"
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(1200):
                if serving.done():
                    serving.result()  # it failed to start: say why
                with_status = await http.get("/healthz") if server.started else None
                if with_status is not None and with_status.status_code == 200:
                    break
                await asyncio.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        await serving


async def test_a_slow_store_does_not_delay_the_streamed_tokens(slow_gateway: str) -> None:
    async with httpx.AsyncClient(base_url=slow_gateway, timeout=60) as http:
        conversation = (await http.post("/backend-api/conversations", json={})).json()["id"]
        body = {"model": MODEL, "max_tokens": 24, "temperature": 0, "stream": True, "conversation": conversation,
                "messages": [{"role": "user", "content": "Tell me about the sea."}]}
        deltas: list[tuple[float, str]] = []
        sent = time.monotonic()
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    content = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if content:
                        deltas.append((time.monotonic() - sent, content))
        assert len(deltas) > 10
        # Every token came before the first write (the turn's insert) could even have finished.
        assert deltas[-1][0] < SLOW_S, deltas
        streamed = "".join(text for _, text in deltas)
        for _ in range(200):  # the reply is written behind: it gets there, whole
            reply = (await http.get(f"/backend-api/conversation/{conversation}")).json()["messages"][-1]
            if reply["role"] == "assistant" and reply["status"] != "in_progress":
                break
            await asyncio.sleep(0.1)
        assert reply["content"][0]["text"] == streamed and reply["status"] in ("completed", "incomplete")
