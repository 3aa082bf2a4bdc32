"""What the realtime core takes (RealtimeCore.handle): a parsed client event, a VAD edge, a transcript, an
engine delta or result, a playout mark, an audio tick. The driver that learns it feeds it; a command carried
out comes back as one of these (StopResponse as ResponseEnded, ClearPlayout as PlayoutCleared)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.response_events import ResponseEvents, ResponseStatus, TokenUsage
from inference.llm.tool_calls import ToolCall


class IllegalInput(RuntimeError):
    """An input the core's state cannot take: a driver's bug (a client's refused event is an ApiError). Its
    message names the input's type and the state, never user text."""


@dataclass(frozen=True)
class ConversationAttached:
    """Before the session starts: it continues a stored conversation, whose branch becomes its first items."""

    conversation: Conversation


@dataclass(frozen=True)
class PlayoutAttached:
    """Before the session starts: its audio goes through a WebRTC playout buffer, which reports what was heard."""


@dataclass(frozen=True)
class ErrorOccurred:
    """What a driver was commanded failed in a way the client is told of (a response refused): an `error` event."""

    error: ApiError


@dataclass(frozen=True)
class SessionStarted:
    resume_token: str | None  # announced in session.created when the session can be resumed
    listens: bool = False  # it has a voice pipeline, which the core tells the input settings (ConfigureListening)


@dataclass(frozen=True)
class ConfigChanged:
    """session.update, validated against the models by the driver."""

    config: SessionConfig


@dataclass(frozen=True)
class ItemCreated:
    """conversation.item.create (screened by the driver)."""

    item: Item
    previous_item_id: str | None = None


@dataclass(frozen=True)
class ItemRetrieve:
    item_id: str


@dataclass(frozen=True)
class ItemDelete:
    item_id: str


@dataclass(frozen=True)
class ItemTruncate:
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class ResponseRequested:
    """response.create."""

    params: ResponseParams
    event_id: str | None = None


@dataclass(frozen=True)
class ReplyWhenFree:
    """A note the voice says of its own accord (GPT-Live's commentary, a delegation's result): the core adds it
    and asks for a reply once nobody speaks, in the order the notes came."""

    note: Item
    params: ResponseParams


@dataclass(frozen=True)
class CancelRequested:
    """response.cancel."""

    response_id: str | None


@dataclass(frozen=True)
class OutputClearRequested:
    """output_audio_buffer.clear (WebRTC): a barge-in the client decided."""


@dataclass(frozen=True)
class AudioCommitted:
    """input_audio_buffer.commit: the buffered audio (not empty: the driver checked) becomes `item_id`."""

    item_id: str


@dataclass(frozen=True)
class AudioCleared:
    """input_audio_buffer.clear."""


@dataclass(frozen=True)
class SpeechBegan:
    """The VAD's speech started: a user turn opens as `item_id`."""

    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechEnded:
    """The VAD's speech stopped: the turn is committed."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class AudioProcessed:
    """The VAD has taken in more audio (the core's timer tick: echo guard, idle timeout, a paused reply)."""

    audio_end_ms: int
    turn_voiced_ms: float = 0.0  # the open turn's voiced audio so far (the VAD's speech windows); 0 with none


@dataclass(frozen=True)
class TranscriptPartial:
    """A transcription of the open turn's audio so far (the user is still speaking)."""

    item_id: str
    text: str  # the whole hypothesis


@dataclass(frozen=True)
class SilenceHeard:
    """The VAD took in more of the open turn's audio: the silence running now (None: none), whether its last
    window was speech, and whether a transcription already running reaches the end of the audio."""

    item_id: str
    silence_ms: float | None
    speech: bool
    covered: bool


@dataclass(frozen=True)
class EndOfTurnJudged:
    """The judges' probabilities that the open turn is complete (a silence is running): the audio model's and
    the LLM's from the words so far; None for a judge that is not there or failed. `words_sure`: whether Whisper
    was sure of those words (inference.transcript_checks.heard_surely)."""

    item_id: str
    audio: float | None
    text: float | None
    words_sure: bool = True


@dataclass(frozen=True)
class TranscriptFinal:
    item_id: str
    text: str  # screened by the driver
    audio_seconds: float
    avg_logprob: float | None = None  # Whisper's confidence in the words (inference.asr.Transcript); None: unknown


@dataclass(frozen=True)
class TranscriptSpeculated:
    """The open turn's speculative transcript (made at the first short silence) is ready: over a paused reply, its
    words decide at once whether the speech was a backchannel, before the turn ends."""

    item_id: str
    text: str  # not screened: it decides only, it is never sent
    avg_logprob: float | None = None


@dataclass(frozen=True)
class TranscriptFailed:
    item_id: str
    error: ApiError
    refused: bool = False  # the policy refused the words (also an `error` event), rather than the model failing


@dataclass(frozen=True)
class TranscriptionAbandoned:
    """The committed item's transcription task ended without a transcript (the session is closing)."""

    item_id: str


@dataclass(frozen=True)
class TurnReady:
    """A transcribed turn may now be answered (its reply generated ahead, if any, is settled)."""

    item_id: str


@dataclass(frozen=True)
class ResponseStarted:
    """The driver built a response (model, tools, prompt): it is in progress from now."""

    events: ResponseEvents
    writes_conversation: bool
    open_message: bool  # open the assistant message now (without tools the reply is text, never calls)


@dataclass(frozen=True)
class TokensReserved:
    """The response reserved its key's tokens: rate_limits.updated says what is left."""

    response_id: str
    rate_limit: dict[str, object]


@dataclass(frozen=True)
class MessageOpened:
    response_id: str


@dataclass(frozen=True)
class FunctionCallsMade:
    response_id: str
    calls: list[ToolCall]


@dataclass(frozen=True)
class TextDelta:
    response_id: str
    text: str


@dataclass(frozen=True)
class AudioDelta:
    response_id: str
    audio_b64: str


@dataclass(frozen=True)
class SpeechWritten:
    """`ms` more of the reply's audio went out (as deltas, or into the WebRTC playout buffer)."""

    response_id: str
    ms: float


@dataclass(frozen=True)
class ClauseSpoken:
    """All of a clause's audio went out: the reply's text lines up with its audio there (what truncation keeps)."""

    response_id: str
    text: str


@dataclass(frozen=True)
class MetadataAdded:
    """The response's metadata gains entries (the memories it recalled or saved): response.done lists them."""

    response_id: str
    metadata: dict[str, str]


@dataclass(frozen=True)
class ResponseFiltered:
    """The reply matched a block rule (generation stopped): its audio stops as in a barge-in."""

    response_id: str


@dataclass(frozen=True)
class ResponseEnded:
    """The response's run ended (or, after StopResponse, was stopped: status cancelled)."""

    response_id: str
    status: ResponseStatus
    latency: dict[str, Any]  # the turn's marks (response.done's metadata)
    reason: str | None = None
    usage: TokenUsage | None = None
    error: ApiError | None = None
    heard_ms: float | None = None  # WebRTC: the item's audio played; None: what was sent counts as heard


@dataclass(frozen=True)
class PlayoutStarted:
    """The WebRTC track started playing a reply."""


@dataclass(frozen=True)
class PlayoutStopped:
    """The WebRTC track played `item_id`'s audio out."""

    item_id: str | None


@dataclass(frozen=True)
class PlayoutCleared:
    """ClearPlayout done: `played_ms` of `item_id` had been played."""

    item_id: str
    played_ms: float


Input = (
    ConversationAttached | PlayoutAttached | ErrorOccurred | SessionStarted | ConfigChanged | ItemCreated | ItemRetrieve | ItemDelete | ItemTruncate | ResponseRequested
    | ReplyWhenFree | CancelRequested | OutputClearRequested | AudioCommitted | AudioCleared | SpeechBegan | SpeechEnded
    | AudioProcessed | SilenceHeard | TranscriptPartial | EndOfTurnJudged | TranscriptSpeculated | TranscriptFinal | TranscriptFailed | TranscriptionAbandoned | TurnReady
    | ResponseStarted | TokensReserved | MessageOpened | FunctionCallsMade | TextDelta | AudioDelta | SpeechWritten
    | ClauseSpoken | MetadataAdded | ResponseFiltered | ResponseEnded | PlayoutStarted | PlayoutStopped | PlayoutCleared
)
