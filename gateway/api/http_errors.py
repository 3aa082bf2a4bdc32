"""HTTP error answers: OpenAI's error body, Retry-After, counted in /metrics."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from gateway.platform import metrics
from gateway.protocol.errors import ApiError


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    all_headers = dict(headers or {})
    all_headers.update(error.headers or {})
    if error.retry_after_s is not None:
        all_headers["retry-after"] = str(max(1, round(error.retry_after_s)))
    metrics.ERRORS.labels("http", error.code).inc()
    return JSONResponse({"error": error.body()}, status_code=error.status, headers=all_headers)
