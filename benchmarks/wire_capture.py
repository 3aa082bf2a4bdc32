"""What a client sees on the wire, captured so that a restructuring can show it changed nothing users see.

Against a running gateway, one scripted exchange per text protocol: Chat Completions (streamed and not), the
Responses API (streamed), the streaming conversation API (/backend-api/conversation/{id}/messages) and a
Realtime WebSocket session (a reply, a cancelled reply, a refused event). Each event is kept as its shape: the
keys, the values of the keys that name a kind (`type`, `status`, `finish_reason`...), and the type of every
other value (ids, times and text vary from run to run). Greedy sampling everywhere, so the number of deltas
does not vary either.

    gateway serve --port 8411 &
    python -m benchmarks.wire_capture --url http://127.0.0.1:8411 --out after.json
    python -m benchmarks.wire_capture --compare before.json after.json

`--compare` prints the first difference of each exchange and exits 1 when any exchange differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx
import websockets

# Keys whose values name a kind of thing, kept as they are; every other leaf becomes its type's name.
KINDS = frozenset({"type", "object", "status", "role", "finish_reason", "o", "p", "code", "reason", "content_type",
                   "event", "param", "modalities", "output_modalities", "tool_choice"})
QUESTION = "What is the capital of France?"
MAX_TOKENS = 16


def shape(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v, key) for v in value]
    if key in KINDS and isinstance(value, (str, bool)) or value is None:
        return value
    return type(value).__name__


def _sse_events(body: str) -> list[Any]:
    """An SSE body as its events: (event name or None, the data's JSON, or the data itself where it is not JSON)."""
    events = []
    for block in body.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if not data:
            continue
        text = "\n".join(data)
        try:
            payload: Any = json.loads(text)
        except ValueError:
            payload = text
        events.append({"event": name, "data": shape(payload)})
    return events


async def _chat(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "max_tokens": MAX_TOKENS}
    plain = await http.post("/v1/chat/completions", json=body)
    streamed = await http.post("/v1/chat/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}})
    refused = await http.post("/v1/chat/completions", json={**body, "temperature": 9})
    return {"plain": [plain.status_code, shape(plain.json())],
            "streamed": [streamed.status_code, _sse_events(streamed.text)],
            "refused": [refused.status_code, shape(refused.json())]}


async def _responses(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    body = {"model": model, "input": QUESTION, "temperature": 0, "max_output_tokens": MAX_TOKENS, "stream": True}
    streamed = await http.post("/v1/responses", json=body)
    return {"streamed": [streamed.status_code, _sse_events(streamed.text)]}


async def _conversation_stream(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    created = await http.post("/backend-api/conversations", json={})
    conversation = created.json()["id"]
    posted = await http.post(f"/backend-api/conversation/{conversation}/messages",
                             json={"model": model, "content": QUESTION, "temperature": 0, "max_tokens": MAX_TOKENS})
    missing = await http.post(f"/backend-api/conversation/{conversation}/messages",
                              json={"model": model, "content": QUESTION, "parent_message_id": "msg_none"})
    return {"created": [created.status_code, shape(created.json())],
            "message": [posted.status_code, _sse_events(posted.text)],
            "missing_parent": [missing.status_code, shape(missing.json())]}


async def _realtime(url: str, model: str) -> dict[str, Any]:
    ws_url = url.replace("http", "ws", 1) + f"/v1/realtime?model={model}"
    out: dict[str, Any] = {}
    async with websockets.connect(ws_url, max_size=None) as ws:
        async def until(kind: str) -> list[Any]:
            seen = []
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                seen.append(shape(event))
                if event["type"] == kind:
                    return seen

        out["created"] = await until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                        "output_modalities": ["text"]}}))
        out["updated"] = await until("session.updated")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": MAX_TOKENS}}))
        out["reply"] = await until("response.done")
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        await ws.send(json.dumps({"type": "response.cancel"}))
        # How many deltas come before the cancel lands depends on the machine: the rest does not.
        out["cancelled"] = [e for e in await until("response.done") if e["type"] != "response.output_text.delta"]
        await ws.send(json.dumps({"type": "response.cancel"}))
        out["nothing_to_cancel"] = await until("error")
        await ws.send(json.dumps({"type": "no.such.event"}))
        out["refused"] = await until("error")
    return out


async def capture(url: str, model: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": "Bearer unused"}) as http:
        return {"chat_completions": await _chat(http, model), "responses": await _responses(http, model),
                "conversation_stream": await _conversation_stream(http, model),
                "realtime": await _realtime(url, model)}


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {json.dumps(a)[:200]} / {json.dumps(b)[:200]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'the second' if k not in a else 'the first'}"
            found = _first_difference(a[k], b[k], f"{path}/{k}")
            if found:
                return found
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else f"{path}: {len(a)} / {len(b)} entries"
    return None if a == b else f"{path}: {a!r} / {b!r}"


def compare(first: dict[str, Any], second: dict[str, Any]) -> bool:
    same = True
    for protocol in sorted(set(first) | set(second)):
        difference = _first_difference(first.get(protocol), second.get(protocol), protocol)
        print(f"{protocol}: {'identical' if difference is None else 'differs at ' + difference}")
        same = same and difference is None
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", help="write the capture here (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("FIRST", "SECOND"), help="compare two captures")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            return 0 if compare(json.load(f), json.load(g)) else 1
    captured = asyncio.run(capture(args.url, args.model))
    text = json.dumps(captured, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
