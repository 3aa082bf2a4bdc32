"""POST /v1/realtime/client_secrets: ephemeral keys, so a browser never holds a long-lived one."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig, apply_session_update
from gateway.services import Services

router = APIRouter()


@router.post("/v1/realtime/client_secrets")
async def mint_client_secret(request: Request) -> JSONResponse:
    """A short-lived token that opens one Realtime session with the given configuration."""
    svc: Services = request.app.state.services
    principal, headers = svc.authorize(request.headers.get("authorization"))
    body = await request.body()
    try:
        payload = json.loads(body) if body else {}
    except json.JSONDecodeError:
        raise ApiError("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(payload, dict):
        raise ApiError("invalid_request", "The request body must be a JSON object.")
    ttl = svc.settings.client_secret_ttl_s
    expires_after = payload.get("expires_after")
    if isinstance(expires_after, dict) and isinstance(expires_after.get("seconds"), int):
        ttl = min(max(10, expires_after["seconds"]), 7200)
    session_update = payload.get("session") or {}
    session_update = {key: value for key, value in session_update.items() if key != "type"} if isinstance(session_update, dict) else session_update
    if isinstance(session_update, dict) and "model" in session_update:
        svc.require_model(str(session_update["model"]), "session.model")
    # Validate now, so a bad configuration fails here and not when the browser connects.
    session = apply_session_update(SessionConfig(model=svc.settings.model_name), session_update, param="session")
    value, expires_at = svc.auth.mint(principal, session_update, ttl)
    return JSONResponse(
        {"value": value, "expires_at": int(expires_at), "session": session.model_dump(exclude={"id", "expires_at"})},
        headers=headers,
    )
