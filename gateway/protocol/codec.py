"""Wire <-> events. No I/O: bytes or text in, a validated event or an ApiError out."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.protocol.client_events import CLIENT_EVENT_ADAPTER, CLIENT_EVENT_TYPES, ITEM_TYPES, ClientEvent
from gateway.protocol.errors import ApiError
from gateway.protocol.json_input import decode_json
from gateway.protocol.validation import api_error_from_validation

UNION_TAGS = CLIENT_EVENT_TYPES | ITEM_TYPES


def event_envelope(raw: str | bytes, *, max_bytes: int) -> tuple[dict[str, Any], str, str | None]:
    """One message of a Realtime or GPT-Live client: its JSON object, its type and its event id (when it has one).
    Raises ApiError for a message too large, not a JSON object, or without a type."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise ApiError("message_too_large", f"Event of {size} bytes exceeds the {max_bytes}-byte limit.")
    data = decode_json(raw)
    if not isinstance(data, dict):
        raise ApiError("invalid_json", "An event must be a JSON object.")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    event_type = data.get("type")
    if not isinstance(event_type, str):
        raise ApiError("missing_required_parameter", "Missing required parameter: 'type'.", "type", event_id=event_id)
    return data, event_type, event_id


def decode_client_event(raw: str | bytes, *, max_bytes: int) -> ClientEvent:
    """Parse one WebSocket / data channel message. Raises ApiError carrying the event's id when known."""
    data, event_type, event_id = event_envelope(raw, max_bytes=max_bytes)
    if event_type not in CLIENT_EVENT_TYPES:
        raise ApiError(
            "unknown_event_type",
            f"Unknown event type '{event_type[:100]}'. Supported: {', '.join(sorted(CLIENT_EVENT_TYPES))}.",
            "type",
            event_id=event_id,
        )
    try:
        return CLIENT_EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        error = api_error_from_validation(exc, union_tags=UNION_TAGS)
        error.event_id = event_id
        raise error from None


def encode_server_event(event: dict[str, Any]) -> str:
    """ASCII-only JSON: whatever text an event carries (a client's own, echoed), it can be written."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=True)
