"""The OpenAPI document's additions: request bodies that the handlers decode themselves (through the one
JSON boundary, not FastAPI's), and OpenAI's error shape on every error status an endpoint can answer."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_COMPONENTS = "#/components/schemas/"
# Models named by json_body(), whose schemas join the document's components.
_BODY_MODELS: dict[str, type[BaseModel]] = {}

_DESCRIPTIONS = {
    400: "Malformed or invalid request: `invalid_json` (bad JSON, UTF-8 or nesting, a lone surrogate), "
    "`invalid_type`, `invalid_value`, `missing_required_parameter`, ...; `param` names the field",
    401: "Missing or wrong API key (`invalid_api_key`)",
    404: "Unknown model, call or route",
    409: "A request with this Idempotency-Key is still in progress",
    413: "The body is over --max-request-bytes (or the endpoint's own smaller limit)",
    415: "Unsupported Content-Type",
    422: "Idempotency-Key reused with another body",
    429: "Rate limit, full engine queue, or a bound on sessions or client secrets; see Retry-After",
    503: "The models are loading, or the voice models are not loaded",
}


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error body."""

    error: ErrorObject


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with OpenAI's error body."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses}


def request_body(content: dict[str, dict[str, Any]], *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra=` for a route that reads its body itself: media type -> {"schema": ...}."""
    return {"requestBody": {"required": required, "content": content}}


def json_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra=` for a route whose JSON body is `model`."""
    _BODY_MODELS[model.__name__] = model
    return request_body({"application/json": {"schema": {"$ref": _COMPONENTS + model.__name__}}}, required=required)


def install(app: FastAPI) -> None:
    """Make app.openapi() FastAPI's document plus the body models' schemas (built once, then cached)."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, model in _BODY_MODELS.items():
                body = model.model_json_schema(ref_template=_COMPONENTS + "{model}")
                components.update(body.pop("$defs", {}))
                components[name] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
