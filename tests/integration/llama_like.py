"""A real HTTP server on loopback that answers as llama.cpp's OpenAI-compatible server does (issue 28): it
lists its model, refuses token-id prompts with a 500 whose body lists the prompt, and serves chat
completions, by relaying them to a real gateway. ``failing`` makes it answer everything with a 500 whose
body echoes the request (the prompt's words or token ids), as a broken server's would."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.platform.processes import free_port


class LlamaLikeServer:
    def __init__(self, worker_url: str, worker_key: str, worker_model: str, served: list[str],
                 takes_token_ids: bool = False) -> None:
        self.worker_url = worker_url
        self.worker_key = worker_key
        self.worker_model = worker_model
        self.served = served
        self.takes_token_ids = takes_token_ids
        self.failing = False
        self.refused: list[Any] = []  # the prompts (or messages) of the requests it answered with a 500
        self.port = free_port("127.0.0.1")
        app = Starlette(routes=[Route("/v1/models", self._models),
                                Route("/v1/completions", self._completions, methods=["POST"]),
                                Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="llama-like server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LlamaLikeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the llama-like server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "me"}
                                                        for name in self.served]})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        if refused := self._refusal(body, "prompt"):
            return refused
        if isinstance(body.get("prompt"), list) and not self.takes_token_ids:
            return self._validation_error(body["prompt"])
        return await self._relay(request, "/v1/completions", body)

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        return self._refusal(body, "messages") or await self._relay(request, "/v1/chat/completions", body)

    def _refusal(self, body: dict[str, Any], field: str) -> Response | None:
        if body.get("model") not in self.served:
            return JSONResponse({"error": {"code": 404, "message": "model not found", "type": "not_found_error"}},
                                status_code=404)
        return self._validation_error(body.get(field)) if self.failing else None

    async def _relay(self, request: Request, path: str, body: dict[str, Any]) -> Response:
        """To the real gateway, under its model name (llama.cpp's server answers to any name it lists)."""
        client = httpx.AsyncClient(base_url=self.worker_url, timeout=60)
        upstream = await client.send(client.build_request(
            "POST", path, json={**body, "model": self.worker_model},
            headers={"authorization": f"Bearer {self.worker_key}"}), stream=True)

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))


    def _validation_error(self, value: Any) -> Response:
        """llama_cpp.server's answer to a prompt it cannot take: HTTP 500, the whole input in the message."""
        self.refused.append(value)
        errors = [{"type": "string_type", "loc": ("body", "prompt", "str"), "msg": "Input should be a valid string",
                   "input": value}] * 38
        return JSONResponse({"error": {"message": f"38 validation errors:\n{errors}", "type": "internal_server_error",
                                       "param": None, "code": None}}, status_code=500)
