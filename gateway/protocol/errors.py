"""Errors that reach clients: one shape for Realtime `error` events and for HTTP error bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ApiError(Exception):
    """An error a client caused or must be told about.

    `code` is machine-readable (e.g. `invalid_value`), `param` names the offending field when known,
    `status` is the HTTP status used when the error is answered over HTTP.
    """

    code: str
    message: str
    param: str | None = None
    type: str = "invalid_request_error"
    status: int = 400
    event_id: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        """OpenAI's error object: {"message", "type", "param", "code"}."""
        error: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        if self.event_id is not None:
            error["event_id"] = self.event_id
        return error


def invalid_value(message: str, param: str | None = None) -> ApiError:
    return ApiError("invalid_value", message, param)


def not_found(code: str, message: str, param: str | None = None) -> ApiError:
    return ApiError(code, message, param, status=404)


def overloaded(message: str, retry_after_s: float) -> ApiError:
    return ApiError("server_overloaded", message, type="server_error", status=429, retry_after_s=retry_after_s)
