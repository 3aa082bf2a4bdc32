"""The application answers a SIP call it was told of (sip_trunk.py), on the surface it chooses: Realtime's
`POST /v1/realtime/calls/{call_id}/accept`, `/reject` and `/refer` (`realtime.call.incoming`), or GPT-Live's
`POST /v1/live/sessions/{session_id}/accept`, `/reject` and `/refer` (`live.transport.incoming`, SRTP calls). The
first accept chooses; the other surface's id is then unknown. `/hangup` is the one each surface's sessions share
(webrtc.py, live_sessions.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.api.caller import AuthorizedCaller
from gateway.api.forwarding import forward_post, replica_of
from gateway.api.http_bodies import read_body, read_json_object, read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import Services, services
from gateway.api.transports.live_factory import feed_history, open_live, require_live_config
from gateway.api.transports.live_sessions import LiveEntry, LiveRegistry
from gateway.api.transports.sip_call import RATE, SipCall, Surface
from gateway.api.transports.sip_trunk import SipTrunk
from gateway.platform.session_seats import Seat
from gateway.protocol.call_requests import LiveRejectCall, ReferCall, RejectCall
from gateway.protocol.errors import ApiError
from gateway.protocol.live_media import decode_live_accept
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_front import LiveFront
from gateway.realtime.session import RealtimeSession
from gateway.realtime.speech_out import PlayoutSpeech

router = APIRouter()


async def _trunk_of(request: Request, call_id: str, surface: Surface = "realtime") -> SipTrunk | Response:
    """This replica's trunk when the call rings here; the owner's answer when it rings on another replica."""
    trunk: SipTrunk | None = request.app.state.sip_trunk
    if trunk is not None and trunk.has_call(call_id, surface):
        return trunk
    owner = await services(request).stores.owner_url(replica_of(call_id))
    if owner is not None:
        return await forward_post(owner, request)
    if trunk is None:
        raise ApiError("sip_not_enabled", "This gateway takes no SIP calls (start it with --sip-listen).", status=404)
    raise ApiError("call_not_found", f"No SIP call '{call_id[:100]}'.", "call_id", status=404)


def _require_voice(request: Request) -> None:
    runtime = services(request).runtime
    runtime.require_ready()
    if not runtime.voice_ready:
        raise ApiError("voice_unavailable", "Phone calls need the voice models, which are not loaded.", status=503)


async def _answer(svc: Services, caller: AuthorizedCaller, seat: Seat, trunk: SipTrunk, call_id: str,
                  session: RealtimeSession, front: LiveFront | None = None) -> SipCall:
    """The session opened on `seat` and the call answered with it, then started; nothing is left of either when
    one of them fails."""
    try:
        await svc.sessions.open_session(session, caller.principal, seat)
    except ApiError:
        await session.close()
        raise
    try:
        call = await trunk.accept(call_id, session, front)
    except ApiError:
        await svc.sessions.end_session(session)
        raise
    session.start()
    return call


async def _refer(request: Request, call_id: str, caller: AuthorizedCaller, surface: Surface) -> Response:
    trunk = await _trunk_of(request, call_id, surface)
    if isinstance(trunk, Response):
        return trunk
    refer = await read_model(request, ReferCall)
    trunk.refer(call_id, refer.target_uri, surface)
    return Response(status_code=200, headers=caller.headers)


@router.post("/v1/realtime/calls/{call_id}/accept", responses=error_responses(400, 401, 404, 409, 429, 503))
async def accept_call(call_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    """Answer the call with the session object in the body, as `client.realtime.calls.accept` sends it."""
    trunk = await _trunk_of(request, call_id)
    if isinstance(trunk, Response):
        return trunk
    svc = services(request)
    _, config = await read_json_object(request, empty={})
    _require_voice(request)
    if "model" in config:
        svc.runtime.require_model(str(config["model"]), "model")
    trunk.require_ringing(call_id)  # 409 before a session is made for a call that has gone
    async with svc.sessions.seat(caller.key_id) as seat:
        session = RealtimeSession(svc.runtime, svc.settings, transport="sip", speech_factory=PlayoutSpeech.create,
                                  initial_config=config or None, request_id=getattr(request.state, "request_id", None))
        call = await _answer(svc, caller, seat, trunk, call_id, session)
    svc.sessions.in_background(call.run(svc.sessions), f"sip call {call.id}")
    return Response(status_code=200, headers=caller.headers)


@router.post("/v1/realtime/calls/{call_id}/reject", openapi_extra=json_body(RejectCall, required=False),
             responses=error_responses(400, 401, 404, 409, 429))
async def reject_call(call_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    trunk = await _trunk_of(request, call_id)
    if isinstance(trunk, Response):
        return trunk
    body = await request.body()
    reject = RejectCall() if not body.strip() else await read_model(request, RejectCall)
    trunk.reject(call_id, reject.status_code)
    return Response(status_code=200, headers=caller.headers)


@router.post("/v1/realtime/calls/{call_id}/refer", openapi_extra=json_body(ReferCall),
             responses=error_responses(400, 401, 404, 409, 429))
async def refer_call(call_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    return await _refer(request, call_id, caller, "realtime")


@router.post("/v1/live/sessions/{session_id}/accept", responses=error_responses(400, 401, 404, 409, 429, 503))
async def accept_live_call(session_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    """Answer the call with a GPT-Live session (`{"session": {...}}`, as `client.live.sessions.accept` sends it),
    whose id is the webhook's: the sideband attaches to it and hangs it up."""
    trunk = await _trunk_of(request, session_id, "live")
    if isinstance(trunk, Response):
        return trunk
    svc = services(request)
    config = decode_live_accept(await read_body(request, svc.settings.max_event_bytes),
                                max_bytes=svc.settings.max_event_bytes)
    _require_voice(request)
    require_live_config(svc, config)
    trunk.require_ringing(session_id, "live")
    async with svc.sessions.seat(caller.key_id) as seat:
        session, front = open_live(svc, config, getattr(request.state, "request_id", None), LiveAudioStream("audio/pcmu", RATE),
                                   caller.key_id, wire_audio=False, session_id=session_id)
        call = await _answer(svc, caller, seat, trunk, session_id, session, front)
        feed_history(session, config)
    registry: LiveRegistry = request.app.state.live_sessions
    registry.add(LiveEntry(session, front, caller.key_id, send_digit=call.send_digit))
    svc.sessions.in_background(call.run(svc.sessions), f"sip live call {call.id}")
    return Response(status_code=200, headers=caller.headers)


@router.post("/v1/live/sessions/{session_id}/reject", openapi_extra=json_body(LiveRejectCall),
             responses=error_responses(400, 401, 404, 409, 429))
async def reject_live_call(session_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    trunk = await _trunk_of(request, session_id, "live")
    if isinstance(trunk, Response):
        return trunk
    reject = await read_model(request, LiveRejectCall)
    trunk.reject(session_id, reject.status_code, "live")
    return Response(status_code=200, headers=caller.headers)


@router.post("/v1/live/sessions/{session_id}/refer", openapi_extra=json_body(ReferCall),
             responses=error_responses(400, 401, 404, 409, 429))
async def refer_live_call(session_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    return await _refer(request, session_id, caller, "live")
