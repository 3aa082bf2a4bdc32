"""The realtime core's events, said in GPT-Live's words. No I/O.

A Live session runs the same core as a Realtime one (core.py); the core's events are Realtime's, and this
turns each into the Live events it means, or none: `session.created` is `session.started`, the user's
transcript deltas are `session.input_transcript.delta` placed on the session's timeline, a response's end
updates the usage, `error` keeps its code. Items, responses and the input buffer are Realtime's own book-keeping
and have no Live event. The assistant's words go out as its audio plays (LiveFront), not as they are generated.

The timeline is milliseconds since the session started; the user's audio is placed on it from the moment its
first chunk arrived (`input_offset_ms`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.protocol.live_events import LiveSessionConfig
from gateway.realtime.response_events import Event

# The Realtime errors that end a session, and Live's reason for the end.
SESSION_ENDINGS = {"session_expired": "expired", "session_idle_timeout": "expired"}


@dataclass
class _InputTurn:
    start_ms: int
    end_ms: int | None = None
    said: str = ""  # the deltas sent so far


class LiveTranslator:
    def __init__(self, config: LiveSessionConfig, model: str, clock_ms: Callable[[], int], *,
                 wire_audio: bool = True) -> None:
        self._config = config
        # A function call the live model made (name, call_id, arguments): its delegation (LiveFront).
        self.on_call: Callable[[str, str, str], None] | None = None
        self._wire_audio = wire_audio  # False over WebRTC: the media transport negotiates the audio format
        self._model = model  # as the client named it (gpt-live-1 is an alias of the served model)
        self._clock_ms = clock_ms
        self._session: dict[str, Any] | None = None  # the resource, from session.created
        self._turns: dict[str, _InputTurn] = {}
        self.input_offset_ms: int | None = None

    def delegation_changed(self, delegation: dict[str, Any]) -> None:
        self.resource["delegation"] = delegation

    @property
    def resource(self) -> dict[str, Any]:
        """The Live session resource (openai.types.live.SessionResource) announced by session.started."""
        assert self._session is not None, "announced once the session has started"
        return self._session

    def usage(self) -> dict[str, Any]:
        return {"seconds": float(self._clock_ms() // 1000)}

    def closed(self, reason: str) -> Event:
        """session.closed: why, the session as it ends, and its usage."""
        return {"type": "session.closed", "reason": reason, "session": self.resource, "usage": self.usage()}

    def __call__(self, event: Event) -> list[Event]:
        match event["type"]:
            case "session.created":
                self._session = self._resource(event["session"])
                return [{"type": "session.started", "session": self._session}]
            case "error" if event["error"].get("code") in SESSION_ENDINGS:
                # The session is over (session_limits.py): Live says so in its terminal event, after the error.
                return [live_error(event["error"]), self.closed(SESSION_ENDINGS[event["error"]["code"]])]
            case "error":
                return [live_error(event["error"])]
            case "input_audio_buffer.speech_started":
                self._turns[event["item_id"]] = _InputTurn(self._on_timeline(event["audio_start_ms"]))
            case "input_audio_buffer.speech_stopped":
                if (turn := self._turns.get(event["item_id"])) is not None:
                    turn.end_ms = self._on_timeline(event["audio_end_ms"])
            case "conversation.item.input_audio_transcription.delta":
                return self._input_words(event["item_id"], event["delta"])
            case "conversation.item.input_audio_transcription.completed":
                turn = self._turns.pop(event["item_id"], None)
                said = turn.said if turn is not None else ""
                # What the stable deltas did not say yet (a revised word cannot be taken back: Live's deltas append).
                rest = event["transcript"][len(said):] if event["transcript"].startswith(said) else ""
                return self._input_words(event["item_id"], rest, turn)
            case "conversation.item.deleted":
                self._turns.pop(event["item_id"], None)
            case "response.done":
                for item in event["response"].get("output") or []:
                    if item.get("type") == "function_call" and self.on_call is not None:
                        self.on_call(item["name"], item["call_id"], item.get("arguments") or "")
                return [{"type": "session.usage.updated", "usage": self.usage()}]
        return []

    def _on_timeline(self, audio_ms: int) -> int:
        return (self.input_offset_ms or 0) + audio_ms

    def _input_words(self, item_id: str, delta: str, turn: _InputTurn | None = None) -> list[Event]:
        turn = turn or self._turns.get(item_id)
        if not delta or turn is None:
            return []
        turn.said += delta
        end_ms = turn.end_ms if turn.end_ms is not None else max(turn.start_ms, self._clock_ms())
        return [{"type": "session.input_transcript.delta", "delta": delta, "start_ms": turn.start_ms,
                 "end_ms": end_ms}]

    def _resource(self, realtime: dict[str, Any]) -> dict[str, Any]:
        config = self._config
        resource: dict[str, Any] = {"id": realtime["id"], "expires_at": realtime["expires_at"], "model": self._model,
                                    "status": "active", "instructions": realtime["instructions"]}
        audio = realtime["audio"]
        fmt = config.audio.format if config.audio is not None and config.audio.format is not None else None
        resource["audio"] = {"output": {"voice": self._voice_name(audio["output"]["voice"])}}
        if self._wire_audio:
            resource["audio"] = {"format": fmt.model_dump() if fmt is not None else {"type": "audio/pcm", "rate": 24000},
                                 **resource["audio"]}
        if config.client is not None:
            resource["client"] = config.client
        if config.input:
            resource["input"] = [item.model_dump(exclude_none=True) for item in config.input]
        if config.safety_identifier is not None:
            resource["safety_identifier"] = config.safety_identifier
        if config.delegation is not None:
            resource["delegation"] = config.delegation.model_dump(exclude_none=True)
        resource["store"] = False
        return resource

    def _voice_name(self, installed: str) -> str:
        """The voice as the client named it (marin selects the installed one), else the installed one's name."""
        output = self._config.audio.output if self._config.audio is not None else None
        return output.voice if output is not None and isinstance(output.voice, str) else installed


def live_error(body: dict[str, Any]) -> Event:
    """A Realtime error body in Live's shape: the client's event id is `client_event_id`, on both levels."""
    error = {key: body[key] for key in ("code", "message", "type") if body.get(key) is not None}
    error.setdefault("code", "server_error")
    if body.get("param") is not None:
        error["param"] = body["param"]
    event: Event = {"type": "error", "error": error}
    if body.get("event_id") is not None:
        error["client_event_id"] = event["client_event_id"] = body["event_id"]
    return event
