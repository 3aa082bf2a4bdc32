"""What the realtime core returns (RealtimeCore.handle), in order: events to send, errors, and commands for
the drivers to carry out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import AudioInput, SessionConfig
from gateway.realtime.conversation import Conversation
from gateway.realtime.inputs import ResponseRequested
from gateway.realtime.response_events import Event, ResponseEvents, ResponseStatus, TokenUsage
from inference.llm.chat import ChatMessage


@dataclass(frozen=True)
class ResponseSession:
    """What a response is planned from, as the core has it when it commands one: the session's configuration,
    its conversation (which the response's item joins, through the core) and whether it can speak."""

    config: SessionConfig
    conversation: Conversation
    can_speak: bool


@dataclass(frozen=True)
class ReplyContext:
    """What a reply made ahead of its turn is built from, as the core has it when it asks: the session's
    configuration, the conversation before the turn as chat messages, and whether a default reply speaks. The
    turn's response builds its prompt the same way, so a reply made ahead is adopted when nothing changed."""

    config: SessionConfig
    history: list[ChatMessage]
    speaks: bool
    conversation_id: str  # the engine's cache of the conversation


@dataclass(frozen=True)
class Send:
    event: Event


@dataclass(frozen=True)
class SendError:
    """An `error` event (the driver counts and logs it)."""

    error: ApiError


@dataclass(frozen=True)
class CreateResponse:
    """Build and start a response: a client's (`event_id`), a user turn's reply (`turn`), or the idle nudge."""

    params: ResponseParams
    event_id: str | None = None
    turn: str | None = None  # the user item it answers: its latency marks and its reply generated ahead
    session: ResponseSession | None = field(default=None, compare=False)  # the core always sets it
    # The client's response.create it answers, at once or (push-to-talk) once the committed audio is transcribed:
    # the session handles the client's next event after this.
    answers: ResponseRequested | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StopResponse:
    """Stop the response's generation and task, then feed ResponseEnded(cancelled, `reason`)."""

    response_id: str
    reason: str
    barge_in: bool


@dataclass(frozen=True)
class ClearPlayout:
    """Drop the queued WebRTC audio; with `measure_item_id`, feed PlayoutCleared with what was heard of it."""

    measure_item_id: str | None


@dataclass(frozen=True)
class SetProducing:
    """WebRTC: whether a reply is still writing audio (the playout's end of reply)."""

    producing: bool


@dataclass(frozen=True)
class HoldPlayout:
    """WebRTC: pause the reply's queued audio where it is (`held`), or play it on from there."""

    held: bool


@dataclass(frozen=True)
class PauseEnded:
    """WebRTC: the reply held by speech over it played on (`resumed`) or was cut (`interrupted`), after `held_s`
    seconds held: what the metrics count, and the voice's partial transcripts go on."""

    outcome: Literal["resumed", "interrupted"]
    held_s: float


@dataclass(frozen=True)
class ConfigureListening:
    """The session's input settings, as it starts and after each session.update: the voice pipeline's turn
    detection, transcription prompt, noise reduction and the format of the audio appended."""

    audio: AudioInput


@dataclass(frozen=True)
class Transcribe:
    """Make the committed item's final transcript; feed TranscriptFinal or TranscriptFailed, then TurnReady."""

    item_id: str


@dataclass(frozen=True)
class PrefillDraft:
    """Prefill the conversation and the open turn's words so far (`text`) into the engine's cache: the turn's
    reply starts sooner. Nothing is sent."""

    item_id: str
    text: str
    context: ReplyContext | None = field(default=None, compare=False)  # the core always sets it


@dataclass(frozen=True)
class SetSilence:
    """semantic_vad: the silence running now in the open turn ends it after `silence_ms`."""

    item_id: str
    silence_ms: int


@dataclass(frozen=True)
class StartSpeculation:
    """Transcribe the open turn's audio so far as its final transcript, ahead of the turn's end; with `preempt`,
    generate its reply from that transcript; with `judge_end` (semantic_vad, or server_vad with
    --server-vad-turn-model), judge whether the turn is over from its audio and its words (feed EndOfTurnJudged).
    The committed turn keeps what was started (DropTurn or its reply releases it)."""

    item_id: str
    preempt: bool
    judge_end: bool
    context: ReplyContext | None = field(default=None, compare=False)  # with `preempt`: the reply's


@dataclass(frozen=True)
class DiscardSpeculation:
    """The user went on speaking: drop the open turn's speculative transcript, its reply and its end judge
    (semantic_vad: the next silence is judged afresh, with the longest wait)."""

    item_id: str


@dataclass(frozen=True)
class DropTurn:
    """A committed turn gets no reply: release what was made ahead for it."""

    item_id: str


@dataclass(frozen=True)
class ResponseFinished:
    """response.done was sent: count and log it."""

    events: ResponseEvents
    status: ResponseStatus
    reason: str | None
    usage: TokenUsage | None
    error: dict[str, Any] | None


Command = (
    CreateResponse | StopResponse | ClearPlayout | SetProducing | HoldPlayout | PauseEnded | ConfigureListening
    | Transcribe
    | PrefillDraft | SetSilence | StartSpeculation | DiscardSpeculation | DropTurn | ResponseFinished
)
Output = Send | SendError | Command
