"""What a client is told when the LLM backend cannot serve a request: one mapping for every API. A remote
server's own words never reach a client (its error body may list the prompt): remote.py logs them, redacted."""

from __future__ import annotations

from gateway.protocol.errors import ApiError, overloaded
from inference.llm.backend import (
    BackendRejected,
    BackendUnavailable,
    EngineClosed,
    EngineOverloaded,
    UnsupportedByBackend,
)

# Catch these around LLMBackend.submit / prefill and around reading a stream.
BACKEND_ERRORS = (EngineOverloaded, EngineClosed, BackendUnavailable, BackendRejected, UnsupportedByBackend)


def backend_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, EngineOverloaded):
        return overloaded("The model is at capacity; retry shortly.", exc.retry_after_s)
    if isinstance(exc, BackendUnavailable):
        return ApiError("backend_unavailable", str(exc), type="server_error", status=503,
                        retry_after_s=exc.retry_after_s)
    if isinstance(exc, BackendRejected):
        return ApiError("backend_error", f"The LLM backend could not serve this request (it answered {exc.status}).",
                        type="server_error", status=502)
    if isinstance(exc, UnsupportedByBackend):
        return ApiError("unsupported_by_backend", str(exc))
    return ApiError("model_not_ready", "The model is shutting down.", type="server_error", status=503,
                    retry_after_s=1.0)
