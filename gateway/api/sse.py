"""Server-sent events, as every streaming HTTP endpoint writes them (chat, completions, responses, the
conversation stream): the frames, the response, and a stream's resume with Last-Event-ID (stream_hub.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from gateway.api.gate import Caller
from gateway.api.http_bodies import read_json_object
from gateway.api.services import Services
from gateway.api.stream_hub import request_fingerprint

DONE = b"data: [DONE]\n\n"


def sse_data(payload: Any, event: str | None = None) -> bytes:
    """One event: `payload` as compact JSON, under an `event:` line when it is named."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


def sse_response(events: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})


async def stream_request(request: Request) -> str:
    """The fingerprint a stream is bound to: a resume must send the request that started it."""
    _, payload = await read_json_object(request)  # the body is read once; this reads it again from memory
    return request_fingerprint(request.url.path, payload)


async def resume_stream(svc: Services, request: Request, caller: Caller) -> StreamingResponse | None:
    """A stream's client reconnecting with `Last-Event-ID` (its body is the same request, not run again): the
    events of the running or recently finished stream after it, then the live ones. None: a new request."""
    last_event_id = request.headers.get("last-event-id")
    if last_event_id is None:
        return None
    buffer, after = svc.stores.streams.get(last_event_id, caller.key_id, await stream_request(request))
    return sse_response(svc.stores.streams.read(buffer, after), caller.headers)
