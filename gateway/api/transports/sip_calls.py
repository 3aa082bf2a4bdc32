"""POST /v1/realtime/calls/{call_id}/accept, /reject and /refer: the application answers a SIP call it was told of
by `realtime.call.incoming` (sip_trunk.py). `/hangup` is the one every call shares (webrtc.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.api.caller import AuthorizedCaller
from gateway.api.forwarding import forward_post, replica_of
from gateway.api.http_bodies import read_json_object, read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import services
from gateway.api.transports.sip_trunk import SipTrunk
from gateway.protocol.call_requests import ReferCall, RejectCall
from gateway.protocol.errors import ApiError
from gateway.realtime.session import RealtimeSession
from gateway.realtime.speech_out import PlayoutSpeech

router = APIRouter()


async def _trunk_of(request: Request, call_id: str) -> SipTrunk | Response:
    """This replica's trunk when the call rings here; the owner's answer when it rings on another replica."""
    trunk: SipTrunk | None = request.app.state.sip_trunk
    if trunk is not None and trunk.has_call(call_id):
        return trunk
    owner = await services(request).stores.owner_url(replica_of(call_id))
    if owner is not None:
        return await forward_post(owner, request)
    if trunk is None:
        raise ApiError("sip_not_enabled", "This gateway takes no SIP calls (start it with --sip-listen).", status=404)
    raise ApiError("call_not_found", f"No SIP call '{call_id}'.", "call_id", status=404)


@router.post("/v1/realtime/calls/{call_id}/accept", responses=error_responses(400, 401, 404, 409, 429, 503))
async def accept_call(call_id: str, request: Request, caller: AuthorizedCaller) -> Response:
    """Answer the call with the session object in the body, as `client.realtime.calls.accept` sends it."""
    trunk = await _trunk_of(request, call_id)
    if isinstance(trunk, Response):
        return trunk
    svc = services(request)
    _, config = await read_json_object(request, empty={})
    svc.runtime.require_ready()
    if not svc.runtime.voice_ready:
        raise ApiError("voice_unavailable", "Phone calls need the voice models, which are not loaded.", status=503)
    if "model" in config:
        svc.runtime.require_model(str(config["model"]), "model")
    trunk.require_ringing(call_id)  # 409 before a session is made for a call that has gone
    async with svc.sessions.seat(caller.key_id) as seat:
        session = RealtimeSession(svc.runtime, svc.settings, transport="sip", speech_factory=PlayoutSpeech.create,
                                  initial_config=config or None, request_id=getattr(request.state, "request_id", None))
        try:
            await svc.sessions.open_session(session, caller.principal, seat)
        except ApiError:
            await session.close()
            raise
        try:
            call = await trunk.accept(call_id, session)
        except ApiError:
            await svc.sessions.end_session(session)
            raise
        session.start()
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
    trunk = await _trunk_of(request, call_id)
    if isinstance(trunk, Response):
        return trunk
    refer = await read_model(request, ReferCall)
    trunk.refer(call_id, refer.target_uri)
    return Response(status_code=200, headers=caller.headers)
