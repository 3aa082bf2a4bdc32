"""A running GPT-Live session by its id, WebSocket or WebRTC: the trusted sideband that watches and steers it
(`GET /v1/live/sessions/{id}/attach`, what `client.live.sideband.connect(session_id=...)` opens) and its hangup
(`POST /v1/live/sessions/{id}/hangup`), whatever its transport: WebSocket, WebRTC or a SIP call (whose accept,
reject and refer are sip_calls.py's). Forks and recordings are refused by name. A session held by another replica
is reached there: its id names it (`sess_<replica>_...`, gateway/api/forwarding.py).

The sideband uses an API key (the session's key: another key's session is as unknown as a wrong id). It gets the
session's Live events from when it attaches, and what only a sideband hears (live_reflection.py): the primary
transport's input audio, and the output audio with its place on the timeline. It may send the session's client
events, but neither audio nor session.start (the primary transport has them); its end is only its own. On a SIP
call it also sends the caller keypad digits (`transport.dtmf.send`, answered by `transport.dtmf.sent`).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response

from gateway.api.caller import AuthorizedCaller
from gateway.api.forwarding import forward_post, relay_websocket, replica_of
from gateway.api.http_errors import error_response
from gateway.api.openapi import error_responses
from gateway.api.services import services
from gateway.api.session_registry import SessionRegistry
from gateway.api.transports.channel import CLOSE_TRY_AGAIN, run_session
from gateway.api.transports.realtime_ws import CLOSE_POLICY, REFUSED_BEFORE_UPGRADE
from gateway.api.transports.webrtc import Call, digest
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.platform.auth import bearer_token, token_from_subprotocols
from gateway.platform.event_log import log_event
from gateway.protocol.codec import encode_server_event
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import decode_dtmf_send
from gateway.protocol.live_media import peek_event
from gateway.realtime.live_front import LiveFront
from gateway.realtime.live_wire import live_error
from gateway.realtime.session import RealtimeSession

router = APIRouter()

# What the primary transport alone sends.
PRIMARY_ONLY = {
    "session.input_audio.append": "A sideband hears the session's audio; the primary transport sends it.",
    "session.start": "The session has started; a sideband attaches to it and never starts it.",
}
UNSERVED = {
    ("POST", "fork"): "Forks are not served by this server.",
    ("GET", "content"): "Stored sessions (recordings) are not served by this server.",
}


@dataclass
class LiveEntry:
    session: RealtimeSession
    front: LiveFront
    key_id: str  # the key that opened it: its sideband and hangup need the same one
    call: Call | None = None  # a WebRTC session's call
    secret_digest: str | None = None  # the client secret that opened a WebRTC session may hang it up
    send_digit: Callable[[str], None] | None = None  # a SIP call's: a keypress to the caller

    def hang_up(self) -> None:
        """session.closed to the primary transport, which ends the session once it is out."""
        self.front.hang_up()
        if self.call is not None and not self.call.tasks:
            self.call.end()  # no events channel to say it on

    async def from_sideband(self, raw: str | bytes) -> None:
        kind, event_id = peek_event(raw, max_bytes=self.session.settings.max_event_bytes)
        if kind in PRIMARY_ONLY:
            self.session.send_error(ApiError("unsupported_event", PRIMARY_ONLY[kind], "type", event_id=event_id))
            return
        if kind == "transport.dtmf.send":
            try:
                self._send_digit(raw)
            except ApiError as error:
                error.event_id = error.event_id or event_id
                self.session.send_error(error)
            return
        await self.front.receive(raw)

    def _send_digit(self, raw: str | bytes) -> None:
        command = decode_dtmf_send(raw, max_bytes=self.session.settings.max_event_bytes)
        if self.send_digit is None:
            raise ApiError("unsupported_event", "transport.dtmf.send is for SIP calls; this session has no phone "
                           "line.", "type")
        self.send_digit(command.event)
        sent: dict[str, str] = {"type": "transport.dtmf.sent", "event": command.event}
        if command.event_id is not None:
            sent["client_event_id"] = command.event_id
        self.session.outbox.send(sent)


class LiveRegistry:
    """The running Live sessions of this replica by id (the app's `state.live_sessions`); an entry goes with its
    session, and a WebRTC session's call hangs up with it (the session registry's end hook)."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._entries: dict[str, LiveEntry] = {}
        sessions.end_hooks.append(self._session_ended)

    def add(self, entry: LiveEntry) -> None:
        self._entries[entry.session.id] = entry

    def get(self, session_id: str) -> LiveEntry | None:
        return self._entries.get(session_id)

    def owned(self, session_id: str, key_id: str) -> LiveEntry:
        """The key's session; another key's is as unknown as a wrong id."""
        entry = self._entries.get(session_id)
        if entry is None or entry.key_id != key_id:
            raise ApiError("session_not_found", f"No running Live session '{session_id[:100]}'.", "session_id",
                           status=404)
        return entry

    def remove(self, session_id: str) -> None:
        self._entries.pop(session_id, None)

    def _session_ended(self, session: RealtimeSession) -> None:
        entry = self._entries.pop(session.id, None)
        if entry is not None and entry.call is not None:
            entry.call.end()  # its supervisor closes the peer connection


async def refuse(websocket: WebSocket, error: ApiError) -> None:
    """A refusal on an accepted Live connection: an `error` event, then the close (1008 auth and not found, 1013)."""
    await websocket.send_text(encode_server_event({"event_id": f"event_{secrets.token_hex(8)}",
                                                   **live_error(error.body())}))
    await websocket.close(CLOSE_POLICY if error.status in (401, 403, 404) else CLOSE_TRY_AGAIN, error.code)


async def refuse_connection(websocket: WebSocket, error: ApiError, event: str) -> None:
    """A Live connection refused before it is accepted: over HTTP when a router or client can act on the status (a
    full replica, a key at its bound), else said on the accepted connection (refuse)."""
    log_event(event, request_id=getattr(websocket.state, "request_id", None), code=error.code)
    if error.status in REFUSED_BEFORE_UPGRADE:
        await websocket.send_denial_response(error_response(error))
    else:
        await websocket.accept()
        await refuse(websocket, error)


@router.websocket("/v1/live/sessions/{session_id}/attach")
async def attach(websocket: WebSocket, session_id: str) -> None:
    svc = services(websocket)
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    try:
        principal = (await svc.gate.authorize(token)).principal  # an API key: a client secret is refused
        if websocket.query_params.get("graceful_close", "true") not in ("true", "false"):
            raise ApiError("invalid_value", "graceful_close must be true or false.", "graceful_close")
        registry: LiveRegistry = websocket.app.state.live_sessions
        owner = None if registry.get(session_id) is not None else await svc.stores.owner_url(replica_of(session_id))
        entry = registry.owned(session_id, principal.key_id) if owner is None else None
    except ApiError as error:
        await refuse_connection(websocket, error, "live.sideband.refused")
        return
    await websocket.accept()
    if entry is None:  # the session lives on another replica: relayed to its owner, which checks the key
        assert owner is not None
        await relay_websocket(websocket, owner)
        return
    session = entry.session
    tap = session.outbox.tap()
    try:  # a watcher: it always closes with a close frame (graceful_close), and the session goes on
        await run_session(WebSocketChannel(websocket, "sideband"), session, tap, attachment=None, hub=None, end=None,
                          receive=entry.from_sideband)
    finally:
        session.outbox.untap(tap)


@router.post("/v1/live/sessions/{session_id}/hangup", status_code=200, responses=error_responses(401, 404, 429))
async def hang_up(session_id: str, request: Request) -> Response:
    svc = services(request)
    registry: LiveRegistry = request.app.state.live_sessions
    token = bearer_token(request.headers.get("authorization"))
    # Not the caller dependency: the client secret that opened a WebRTC session hangs it up without a key.
    opened = registry.get(session_id)
    if opened is None and (owner := await svc.stores.owner_url(replica_of(session_id))) is not None:
        return await forward_post(owner, request)  # the session lives on another replica: its owner answers
    if opened is not None and opened.secret_digest is not None and digest(token) == opened.secret_digest:
        entry, headers = opened, {}
    else:
        caller = await svc.gate.authorize(token)
        entry, headers = registry.owned(session_id, caller.key_id), caller.headers
    entry.hang_up()
    return Response(status_code=200, headers=headers)


def _unserved(message: str) -> Callable[[str, AuthorizedCaller], Awaitable[Response]]:
    async def refuse_operation(session_id: str, caller: AuthorizedCaller) -> Response:
        raise ApiError("unsupported_operation", message)

    return refuse_operation


for (method, operation), why in UNSERVED.items():
    router.add_api_route(f"/v1/live/sessions/{{session_id}}/{operation}", _unserved(why), methods=[method],
                         responses=error_responses(400, 401, 429), name=f"live_{operation}")
