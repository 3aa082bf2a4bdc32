"""Server -> client Realtime events (OpenAI GA names), as typed models.

Every event the realtime core (and its driver) sends is built here, so a field's name and type are
written once; `wire()` gives the dict the outbox numbers and encodes. A response's events are put in
order by ResponseEvents (realtime/response_events.py), with the models below. The fields follow the
openai SDK's types: the contract tests check every event against them.
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
    previous_item_id: str | None = None  # left out of the event when not given (a response's message)
    item: Wire

    def wire(self) -> Event:
        event = self.model_dump()
        if "previous_item_id" not in self.model_fields_set:
            del event["previous_item_id"]
        return event


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


class DtmfReceived(ServerEvent):
    type: Literal["input_audio_buffer.dtmf_event_received"] = "input_audio_buffer.dtmf_event_received"
    event: str  # the key: 0-9, *, #, A-D
    received_at: int  # Unix seconds


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


# -- a response's events -------------------------------------------------------------------------------


class RealtimeResponse(BaseModel):
    """The `response` object of response.created and response.done."""

    model_config = ConfigDict(frozen=True)
    object: Literal["realtime.response"] = "realtime.response"
    id: str
    status: str
    status_details: Wire | None
    output: list[Wire]
    conversation_id: str | None
    output_modalities: list[str]
    max_output_tokens: int | str
    audio: Wire
    usage: Wire | None
    metadata: dict[str, str] | None


class ResponseCreated(ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: RealtimeResponse


class ResponseDone(ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: RealtimeResponse


class OutputItemAdded(ServerEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    response_id: str
    output_index: int
    item: Wire


class OutputItemDone(ServerEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    response_id: str
    output_index: int
    item: Wire


class ContentEvent(ServerEvent):
    """An event about the response message's one content part (its `type` is each subclass's)."""

    type: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int = 0


class ContentPartAdded(ContentEvent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: Wire


class ContentPartDone(ContentEvent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: Wire


class OutputTextDelta(ContentEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class OutputTextDone(ContentEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class OutputAudioTranscriptDelta(ContentEvent):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class OutputAudioTranscriptDone(ContentEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class OutputAudioDelta(ContentEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str  # base64, in the session's output format


class OutputAudioDone(ContentEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class FunctionCallEvent(ServerEvent):
    type: str
    response_id: str
    item_id: str
    output_index: int
    call_id: str


class FunctionCallArgumentsDelta(FunctionCallEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class FunctionCallArgumentsDone(FunctionCallEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str
