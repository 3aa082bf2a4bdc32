"""The ASGI application: routes, error shape, request ids, model loading in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api import openapi
from gateway.api.durable_answers import DurableAnswers
from gateway.api.http_bodies import BodySizeLimit
from gateway.api.http_errors import error_response
from gateway.api.services import Services
from gateway.api.transports import (
    audio_http,
    backend_conversations_http,
    carrier_stream,
    chat_http,
    client_secrets,
    completions_http,
    conversation_items_http,
    conversation_stream,
    live_sessions,
    live_webrtc,
    live_ws,
    memories_http,
    realtime_ws,
    responses_http,
    sip_calls,
    webrtc,
)
from gateway.api.transports.sip_trunk import SipTrunk
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.protocol.errors import ApiError

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).resolve().parents[2] / "static"  # gateway/api/app.py -> the repository


class RequestIdMiddleware:
    """Echo X-Request-ID (or make one) on every HTTP response and WebSocket handshake, keep it in the
    scope's state for the handlers' events, count requests by route and status, and log each request."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"")
        request_id = incoming.decode("latin-1")[:128] if incoming else "req_" + secrets.token_hex(12)
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode("latin-1"))
        if scope["type"] == "websocket":
            async def accept_with_id(message: Message) -> None:
                if message["type"] == "websocket.accept":
                    message["headers"] = [*message.get("headers", []), header]
                await send(message)

            await self.app(scope, receive, accept_with_id)
            return
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
                metrics.HTTP_REQUESTS.labels(route_label(scope, self.routes), str(status)).inc()
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            # The route's template, never the path: no query strings, ids or names a client made up.
            log_event("http.request", request_id=request_id, method=scope["method"],
                      route=route_label(scope, self.routes), status=status or None,
                      duration_ms=round((time.perf_counter() - started) * 1000, 1))


def route_label(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The matched route's template, never the client's path: /metrics gets one series per route
    (`unmatched` for every 404), not one per path a client makes up."""
    route = scope.get("route")
    if route is None:  # answered before routing (a 413 on its Content-Length): match it here
        route = next((candidate for candidate in routes if candidate.matches(scope)[0] == Match.FULL), None)
    return str(getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched")


def build_app(settings: Settings, services: Services | None = None) -> FastAPI:
    svc = services or Services.create(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # asyncio.to_thread's work here is CPU-bound (tokenizing prompts, the heap trim, model loads): more
        # threads than cores would only queue in the kernel. Bounded by the cores, the pool also stops
        # growing with load (asyncio's default allows CPUs + 4 threads, started as calls overlap).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="blocking"))
        await svc.open()
        loader = asyncio.create_task(svc.runtime.load(), name="model loader")
        trunk: SipTrunk | None = app.state.sip_trunk
        try:
            if trunk is not None:
                await trunk.start()
            yield
        finally:
            if trunk is not None:
                await trunk.stop()  # ringing calls declined, answered ones hung up, before the sessions close
            await shutdown(svc, loader)

    # No /docs page: Swagger UI loads its scripts from a CDN, which an offline machine cannot reach.
    app = FastAPI(title="Realtime gateway", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.services = svc
    app.state.calls = webrtc.CallRegistry(svc.sessions)
    app.state.live_sessions = live_sessions.LiveRegistry(svc.sessions)
    app.state.sip_trunk = SipTrunk(settings, svc.sessions, app.state.calls) if settings.sip_listen else None
    # Innermost: an answer waits for the durable changes its request made (a spent secret, an idempotent answer).
    app.add_middleware(DurableAnswers)
    # The body limit sits inside the request ids, so that its 413s get an id and are counted too.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestIdMiddleware, routes=app.router.routes)
    openapi.install(app)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        return error_response(ApiError("invalid_value", str(first.get("msg", "invalid request")), param, status=422))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(ApiError(code, str(exc.detail), status=exc.status_code))

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, exc: ClientDisconnect) -> Response:
        # Not an error of ours: one line, and 499 (nginx's "client closed request") in the http.request record.
        log.info("client disconnected before its request body was read (%s %s)", request.method,
                 route_label(request.scope, app.router.routes))
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ApiError("internal_error", "The server failed to handle the request.", type="server_error", status=500))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        runtime = svc.runtime
        body: dict[str, Any] = {
            "status": "draining" if svc.sessions.draining else (
                "ready" if runtime.ready.is_set() else ("failed" if runtime.load_error else "loading")),
            "replica": settings.replica_id,
            "model": settings.model_name,
            "device": runtime.device,
            "devices": runtime.devices,  # where each loaded model runs: {"llm": "cpu", "asr": "cpu/int8", "tts": "cpu"}
            # Which Whisper transcribes (--asr-model): whisper-tiny.en, whisper-base, or a folder's name.
            "asr_model": runtime.speech_options.transcription_model if settings.load_voice_models else None,
            # Whisper's input windows (--asr-window-s, --asr-partial-window-s): shorter ones cost less a call.
            "asr_windows_s": ({"final": runtime.asr.window_s, "partial": runtime.asr.partial_window_s}
                              if runtime.asr is not None else None),
            "voice": runtime.voice_ready,
            # The Silero file each band's VAD runs: phone calls (G.711) have their own.
            "vad": {band: path.name for band, path in runtime.vad_models.items()} or None,
            "load_seconds": vars(runtime.load_times),
            # The server's wall clock, so a client (gateway bench) can put the latency marks of response.done
            # on its own timeline: NTP-style, from the probe with the shortest round trip.
            "time_ms": round(time.time() * 1000, 1),
        }
        body["admission"] = runtime.admission.snapshot()  # whether new sessions are taken (platform/admission.py)
        if runtime.engine is not None:
            body["llm"] = runtime.engine.describe()  # what each part of a step runs on (see --llm-kernels)
        if app.state.sip_trunk is not None:
            body["sip"] = app.state.sip_trunk.status()  # where the trunk listens, what it answers, its calls
        if runtime.load_error:
            body["error"] = runtime.load_error
        return JSONResponse(body, status_code=200 if runtime.ready.is_set() and not svc.sessions.draining else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.include_router(chat_http.router)
    app.include_router(completions_http.router)
    app.include_router(responses_http.router)
    app.include_router(realtime_ws.router)
    app.include_router(live_ws.router)
    app.include_router(live_webrtc.router)
    app.include_router(live_sessions.router)
    app.include_router(client_secrets.router)
    app.include_router(backend_conversations_http.router)
    app.include_router(conversation_items_http.router)
    app.include_router(memories_http.router)
    app.include_router(conversation_stream.router)
    app.include_router(webrtc.router)
    app.include_router(carrier_stream.router)
    app.include_router(sip_calls.router)
    app.include_router(audio_http.router)
    webrtc.configure_ice(settings)
    return app


async def shutdown(svc: Services, loader: asyncio.Task[None]) -> None:
    """Close sessions, stop background work, then free the models: every task is cancelled and awaited."""
    loader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loader
    await svc.close()
    await svc.runtime.heap.close()
    await asyncio.to_thread(svc.runtime.close)
