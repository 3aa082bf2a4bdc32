"""Server -> client Realtime events of the session and its turns (OpenAI GA names), as typed models.

Every event the realtime core (and its driver) sends is built here, so a field's name and type are
written once; `wire()` gives the dict the outbox numbers and encodes. A response's own events come
from ResponseEvents (response_events.py). The fields follow the openai SDK's types: the contract
tests check every event against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Event = dict[str, Any]
Wire = dict[str, Any]  # a nested object already in wire form: an item, a session, an error


class ServerEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    def wire(self) -> Event:
        return self.model_dump()


class SessionCreated(ServerEvent):
    type: Literal["session.created"] = "session.created"
    session: Wire
    resume_token: str | None = None  # ours: only when the session can be resumed

    def wire(self) -> Event:
        event = self.model_dump()
        if self.resume_token is None:
            del event["resume_token"]
        return event


class SessionUpdated(ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: Wire


class Error(ServerEvent):
    type: Literal["error"] = "error"
    error: Wire


class ItemAdded(ServerEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None
    item: Wire


class ItemDone(ServerEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None
    item: Wire


class ItemRetrieved(ServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: Wire


class ItemDeleted(ServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ItemTruncated(ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class InputCleared(ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class SpeechStarted(ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class InputCommitted(ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None
    item_id: str


class TimeoutTriggered(ServerEvent):
    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class TranscriptionDelta(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta")
    item_id: str
    content_index: int = 0
    delta: str
    text: str  # ours: the whole current hypothesis, which may still change


class TranscriptionUsage(BaseModel):
    model_config = ConfigDict(frozen=True)
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionCompleted(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed")
    item_id: str
    content_index: int = 0
    transcript: str
    usage: TranscriptionUsage


class TranscriptionFailed(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed")
    item_id: str
    content_index: int = 0
    error: Wire


class OutputStarted(ServerEvent):
    type: Literal["output_audio_buffer.started"] = "output_audio_buffer.started"
    response_id: str | None


class OutputStopped(ServerEvent):
    type: Literal["output_audio_buffer.stopped"] = "output_audio_buffer.stopped"
    response_id: str | None


class OutputCleared(ServerEvent):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str | None


class RateLimitsUpdated(ServerEvent):
    type: Literal["rate_limits.updated"] = "rate_limits.updated"
    rate_limits: list[Wire]
