"""POST /v1/realtime/client_secrets: ephemeral keys, so a browser never holds a long-lived one."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_json_object
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import services
from gateway.platform.auth import MINTED_SESSION_ID
from gateway.protocol.session_config import SessionConfig, apply_session_update
from gateway.protocol.validation import api_error_from_validation
from gateway.realtime.conversation import new_id

router = APIRouter()


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=10, le=7200)


class ClientSecretRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    expires_after: ExpiresAfter | None = None
    session: dict[str, Any] | None = Field(
        None, description="A Realtime session object (as in session.update) that the key's session starts with."
    )


@router.post(
    "/v1/realtime/client_secrets",
    openapi_extra=json_body(ClientSecretRequest, required=False),  # an empty body is {}
    responses=error_responses(400, 401, 404, 413, 429),
)
async def mint_client_secret(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    """A short-lived token that opens one Realtime session with the given configuration."""
    svc = services(request)
    _, payload = await read_json_object(request, empty={})
    try:
        body = ClientSecretRequest.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
    ttl = body.expires_after.seconds if body.expires_after else svc.settings.client_secret_ttl_s
    session_update = dict(body.session or {})  # its type too: a "transcription" session only transcribes
    if "model" in session_update:
        svc.runtime.require_model(str(session_update["model"]), "session.model")
    # Validate now, so a bad configuration fails here and not when the browser connects.
    speech = svc.runtime.speech_options
    session = apply_session_update(speech.apply_defaults(SessionConfig(model=svc.settings.model_name)), session_update,
                                   speech=speech, param="session")
    session_id = new_id("sess")  # the id the session will have: OpenAI's response names it
    value, expires_at = await svc.gate.auth.mint(caller.principal, {**session_update, MINTED_SESSION_ID: session_id},
                                                 ttl)
    wire = {field: item for field, item in session.to_wire().items() if field != "expires_at"}
    return JSONResponse({"value": value, "expires_at": int(expires_at), "session": {**wire, "id": session_id}},
                        headers=caller.headers)
