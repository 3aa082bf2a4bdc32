"""The Realtime session's turn and response state, with no I/O (as websockets' protocol.py and h11's _state.py).

`RealtimeCore.handle(input)` takes one typed input (a parsed client event, a VAD edge, a transcript, an
engine delta or result, a playout mark, an audio tick) and returns what to do, in order: events to send
(`Send`, built by protocol/server_events.py and ResponseEvents) and commands for the driver
(session.py, voice.py) to carry out (`StopResponse`, `CreateResponse`, `ClearPlayout`, `Transcribe`,
`StartSpeculation`...).
One table (`_TRANSITIONS`) maps each input to its handler; a state change and the events announcing it
come out of one call, so no other input sees half of it. Some commands come back as inputs when done:
`StopResponse` as `ResponseEnded` (cancelled), `ClearPlayout` as `PlayoutCleared` (what was heard).

It owns: the conversation, the turn machine (turns.py, driven from here only), the user turn the VAD
has open (its stable words, what is prefilled of it, whether its speculative final transcript runs, how
long its silence must last with semantic_vad), the committed turns still being transcribed, the response
in progress (ResponseEvents), the reply whose audio is playing, the turn reply waiting for the current one
to end, and the idle timer.
The driver owns the tasks, the models, the buffers and the clock it passes in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.protocol import server_events as se
from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SemanticVad, SessionConfig, semantic_wait_ms
from gateway.realtime.conversation import Conversation, Item, SpokenSegment, new_id
from gateway.realtime.response_events import Event, ResponseEvents, ResponseStatus, Usage
from gateway.realtime.turns import Action, TurnMachine, TurnPolicy
from inference.llm.tool_calls import ToolCall

# The speculative final transcript waits for this much silence: Silero drops below its threshold on a
# word's soft ending ("France" over G.711 came out as "friend" when cut at the first silent window).
SPECULATIVE_SILENCE_MS = 64
IDLE_NUDGE = "The user has been silent for a while. Briefly ask whether they are still there."


# -- inputs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionStarted:
    resume_token: str | None  # announced in session.created when the session can be resumed


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
    """The VAD has taken in more audio (the core's timer tick: echo guard, idle timeout)."""

    audio_end_ms: int


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
    """semantic_vad: the LLM's probability that the open turn's words so far end it (a silence is running)."""

    item_id: str
    probability: float


@dataclass(frozen=True)
class TranscriptFinal:
    item_id: str
    text: str  # screened by the driver
    audio_seconds: float


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
    usage: Usage | None = None
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
    SessionStarted | ConfigChanged | ItemCreated | ItemRetrieve | ItemDelete | ItemTruncate | ResponseRequested
    | CancelRequested | OutputClearRequested | AudioCommitted | AudioCleared | SpeechBegan | SpeechEnded
    | AudioProcessed | SilenceHeard | TranscriptPartial | EndOfTurnJudged | TranscriptFinal | TranscriptFailed | TranscriptionAbandoned | TurnReady
    | ResponseStarted | TokensReserved | MessageOpened | FunctionCallsMade | TextDelta | AudioDelta | SpeechWritten
    | ClauseSpoken | MetadataAdded | ResponseFiltered | ResponseEnded | PlayoutStarted | PlayoutStopped | PlayoutCleared
)


# -- outputs -----------------------------------------------------------------------------------------


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
class Transcribe:
    """Make the committed item's final transcript; feed TranscriptFinal or TranscriptFailed, then TurnReady."""

    item_id: str


@dataclass(frozen=True)
class PrefillDraft:
    """Prefill the conversation and the open turn's words so far (`text`) into the engine's cache: the turn's
    reply starts sooner. Nothing is sent."""

    item_id: str
    text: str


@dataclass(frozen=True)
class SetSilence:
    """semantic_vad: the silence running now in the open turn ends it after `silence_ms`."""

    item_id: str
    silence_ms: int


@dataclass(frozen=True)
class StartSpeculation:
    """Transcribe the open turn's audio so far as its final transcript, ahead of the turn's end; with `preempt`,
    generate its reply from that transcript; with `judge_end` (semantic_vad), judge from it whether the words end
    the turn (feed EndOfTurnJudged). The committed turn keeps what was started (DropTurn or its reply releases it)."""

    item_id: str
    preempt: bool
    judge_end: bool


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
    usage: Usage | None
    error: dict[str, Any] | None


Command = (
    CreateResponse | StopResponse | ClearPlayout | SetProducing | Transcribe | PrefillDraft | SetSilence
    | StartSpeculation | DiscardSpeculation | DropTurn | ResponseFinished
)
Output = Send | SendError | Command


@dataclass
class ActiveResponse:
    """The core's view of the response in progress."""

    events: ResponseEvents
    writes_conversation: bool
    cancelling: bool = False
    audio_started: bool = False  # its first audio delta was sent (WebSocket): the echo guard starts there
    clause_start_ms: float = 0.0  # where the clause being spoken starts in the item's audio


class Stabilizer(Protocol):
    """The words successive partial transcripts agree on (inference.asr.TranscriptStabilizer)."""

    def update(self, partial: str) -> str: ...


@dataclass
class _OpenTurn:
    """The user turn the VAD is hearing: its stable words so far, and whether their prefill waits."""

    item_id: str
    stabilizer: Stabilizer
    prefilled: str = ""  # the stable words already prefilled
    prefill_due: bool = False  # a response held the engine: the prefill waits for its end
    speculating: bool = False  # its speculative final transcript (and what follows from it) runs for this silence


@dataclass
class _Committed:
    """A committed user turn: its item, until its transcript is final, then whether it has words."""

    item: Item
    previous_item_id: str | None
    has_text: bool | None = None


@dataclass
class RealtimeCore:
    config: SessionConfig
    conversation: Conversation
    clock: Callable[[], float]  # seconds, monotonic (gateway.platform.latency.now)
    stabilizer: Callable[[], Stabilizer]  # one per user turn
    echo_guard_ms: float = 300.0
    can_speak: bool = False  # the session has a TTS and somewhere to send its audio
    has_playout: bool = False  # WebRTC: the audio goes through a playout buffer that reports what was heard
    preempts: bool = True  # a turn's reply is generated from its speculative transcript (--voice-preemption)
    turns: TurnMachine = field(default_factory=TurnMachine)
    response: ActiveResponse | None = None
    _open: _OpenTurn | None = None  # the user turn the VAD is hearing
    _committed: dict[str, _Committed] = field(default_factory=dict)
    _deferred: list[ResponseRequested] = field(default_factory=list)  # response.create waiting for transcripts
    _queued_turn: str | None = None  # a turn's reply waiting for the response in progress to end
    _speaking: tuple[Item, str] | None = None  # WebRTC: the reply whose audio is still playing, and its response
    _unheard: Item | None = None  # a finished reply cut by ClearPlayout, waiting for what was heard of it
    _idle_since: float = 0.0
    _out: list[Output] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._idle_since = self.clock()
        self._apply_policy()

    # -- the table -----------------------------------------------------------------------------------

    def handle(self, event: Input) -> list[Output]:
        """One input's transition: what to send and do, in order. Raises ApiError for a client event
        that is refused (nothing changed); every other failure is an output."""
        self._out = []
        _TRANSITIONS[type(event)](self, event)
        out, self._out = self._out, []
        return out

    @property
    def open_turn(self) -> str | None:
        """The user item whose speech the VAD is hearing."""
        return self._open.item_id if self._open is not None else None

    @property
    def transcribing(self) -> bool:
        return any(turn.has_text is None for turn in self._committed.values())

    @property
    def deferred_responses(self) -> bool:
        """A response.create waits for committed audio's transcripts (push-to-talk)."""
        return bool(self._deferred)

    @property
    def playout_busy(self) -> bool:
        return self._speaking is not None

    def ensure_no_response(self) -> None:
        if self.response is not None:
            raise ApiError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.events.response_id}. "
                "Wait until the response is finished before creating a new one.",
            )

    # -- session and items ---------------------------------------------------------------------------

    def _started(self, event: SessionStarted) -> None:
        self._idle_since = self.clock()
        self._send(se.SessionCreated(session=self.config.to_wire(), resume_token=event.resume_token))
        previous = None
        for item in self.conversation.items:  # a stored conversation's branch
            self._send(se.ItemAdded(previous_item_id=previous, item=item.to_wire()))
            self._send(se.ItemDone(previous_item_id=previous, item=item.to_wire()))
            previous = item.id

    def _config_changed(self, event: ConfigChanged) -> None:
        config = event.config
        if config.type != self.config.type and (len(self.conversation) or self.response is not None):
            raise ApiError("invalid_value", f"A {self.config.type} session becomes a {config.type} one only before its "
                           "first item.", "session.type")
        if config.wants_audio() and not config.transcribes_only and not self.can_speak:
            raise ApiError("invalid_value", "Audio output needs the voice models (start without --no-load-voice-models).",
                           "session.output_modalities")
        self.config = config
        self._apply_policy()
        self._send(se.SessionUpdated(session=config.to_wire()))

    def _apply_policy(self) -> None:
        detection = self.config.audio.input.turn_detection
        self.turns.policy = TurnPolicy(
            create_response=detection.create_response if detection else False,
            interrupt_response=detection.interrupt_response if detection else False,
            echo_guard_ms=self.echo_guard_ms,
        )

    def _item_created(self, event: ItemCreated) -> None:
        previous = self.conversation.add(event.item, event.previous_item_id)
        self._send(se.ItemAdded(previous_item_id=previous, item=event.item.to_wire()))
        self._send(se.ItemDone(previous_item_id=previous, item=event.item.to_wire()))

    def _item_retrieve(self, event: ItemRetrieve) -> None:
        self._send(se.ItemRetrieved(item=self.conversation.get(event.item_id).to_wire()))

    def _item_delete(self, event: ItemDelete) -> None:
        if self.response is not None and self.response.events.item.id == event.item_id:
            raise ApiError("item_in_use", "The item belongs to the response in progress; cancel it first.", "item_id")
        self.conversation.delete(event.item_id)
        self._send(se.ItemDeleted(item_id=event.item_id))

    def _item_truncate(self, event: ItemTruncate) -> None:
        item = self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        self._send(se.ItemTruncated(item_id=item.id, content_index=event.content_index,
                                    audio_end_ms=round(item.audio_ms_sent)))

    # -- user audio and turns --------------------------------------------------------------------------

    def _audio_committed(self, event: AudioCommitted) -> None:
        if self._open is not None:  # the commit ends the turn the VAD had started
            self._open = None
            if Action.COMMIT not in self.turns.speech_stopped():
                return
        self._commit(event.item_id)  # refused (conversation_full): the client's event gets the error

    def _audio_cleared(self, event: AudioCleared) -> None:
        self._open = None
        self._send(se.InputCleared())

    def _speech_began(self, event: SpeechBegan) -> None:
        self._open = turn = _OpenTurn(event.item_id, self.stabilizer())
        self._send(se.SpeechStarted(audio_start_ms=event.audio_start_ms, item_id=event.item_id))
        if Action.INTERRUPT in self.turns.speech_started(self._now_ms()):
            self._interrupt("turn_detected")
        self._prefill(turn)  # the conversation so far: after a barge-in, once the reply has ended

    def _prefill(self, turn: _OpenTurn) -> None:
        if self.config.transcribes_only:
            return  # a transcription session never answers: nothing to prefill for
        turn.prefill_due = self.response is not None  # it holds the engine, and may still add to the conversation
        if not turn.prefill_due:
            self._out.append(PrefillDraft(turn.item_id, turn.prefilled))

    def _speech_ended(self, event: SpeechEnded) -> None:
        if self.open_turn != event.item_id:
            return
        self._open = None
        self._send(se.SpeechStopped(audio_end_ms=event.audio_end_ms, item_id=event.item_id))
        self._idle_since = self.clock()
        if Action.COMMIT not in self.turns.speech_stopped():
            return
        try:
            self._commit(event.item_id)
        except ApiError as error:  # the conversation is full: the turn is not kept, the session goes on
            self._out.append(DropTurn(event.item_id))
            self.turns.transcript_final(has_text=False)  # back to listening
            self._out.append(SendError(error))

    def _commit(self, item_id: str) -> None:
        """The user item joins the conversation in the same step as the commit; its transcript follows."""
        previous = self.conversation.items[-1].id if len(self.conversation) else None
        item = Item(id=item_id, type="message", role="user", status="in_progress",
                    content=[{"type": "input_audio", "transcript": None}])
        self.conversation.add(item)
        self._committed[item_id] = _Committed(item, previous)
        self._send(se.InputCommitted(previous_item_id=previous, item_id=item_id))
        self._send(se.ItemAdded(previous_item_id=previous, item=item.to_wire()))
        self._out.append(Transcribe(item_id))

    def _audio_processed(self, event: AudioProcessed) -> None:
        if self._open is not None:
            if Action.INTERRUPT in self.turns.tick(self._now_ms(), user_speaking=True):
                self._interrupt("turn_detected")
            return
        detection = self.config.audio.input.turn_detection
        if detection is None or detection.idle_timeout_ms is None or self.response is not None or self.playout_busy:
            return
        if self.clock() - self._idle_since < detection.idle_timeout_ms / 1000:
            return
        self._idle_since = self.clock()
        # As OpenAI does: the silence becomes an empty user turn, and the reply checks on the user.
        item = Item(id=new_id("item"), type="message", role="user", content=[{"type": "input_audio", "transcript": ""}])
        self._send(se.TimeoutTriggered(audio_start_ms=event.audio_end_ms, audio_end_ms=event.audio_end_ms,
                                       item_id=item.id))
        self._item_created(ItemCreated(item))
        if detection.create_response:
            nudge = f"{self.config.instructions}\n\n{IDLE_NUDGE}".strip()
            self._out.append(CreateResponse(ResponseParams(instructions=nudge)))

    def _silence_heard(self, event: SilenceHeard) -> None:
        """A silence long enough starts the speculative final transcript, unless one running reaches this far;
        speech again discards it (and what was started from it)."""
        turn = self._open
        if turn is None or turn.item_id != event.item_id:
            return
        detection = self.config.audio.input.turn_detection
        if event.silence_ms is not None and event.silence_ms >= SPECULATIVE_SILENCE_MS:
            if not turn.speculating and not event.covered:
                turn.speculating = True
                preempt = self.preempts and detection is not None and detection.create_response
                self._out.append(StartSpeculation(turn.item_id, preempt, isinstance(detection, SemanticVad)))
        elif event.speech and turn.speculating:
            turn.speculating = False
            self._out.append(DiscardSpeculation(turn.item_id))

    def _transcript_partial(self, event: TranscriptPartial) -> None:
        """The words two partials agree on are stable: the new ones are the delta, and are prefilled."""
        turn = self._open
        if turn is None or turn.item_id != event.item_id:
            return  # the turn ended while it was transcribed
        stable = turn.stabilizer.update(event.text)
        # A later partial may revise a stable word: nothing new then, until they agree past what was sent.
        delta = stable[len(turn.prefilled):] if stable.startswith(turn.prefilled) else ""
        if delta:
            turn.prefilled = stable
            self._prefill(turn)
        if self.config.audio.input.transcription is not None:  # null: transcription events are off
            self._send(se.TranscriptionDelta(item_id=event.item_id, delta=delta, text=event.text))

    def _end_of_turn_judged(self, event: EndOfTurnJudged) -> None:
        detection = self.config.audio.input.turn_detection
        if self.open_turn != event.item_id or not isinstance(detection, SemanticVad):
            return
        self._out.append(SetSilence(event.item_id, semantic_wait_ms(detection.eagerness, event.probability)))

    def _transcript_final(self, event: TranscriptFinal) -> None:
        turn = self._committed.get(event.item_id)
        if turn is None or turn.has_text is not None:
            return
        turn.has_text = bool(event.text.strip())
        item = turn.item
        item.content[0]["transcript"] = event.text
        item.status = "completed"
        if self.config.audio.input.transcription is not None:
            self._send(se.TranscriptionCompleted(item_id=item.id, transcript=event.text,
                                                 usage=se.TranscriptionUsage(seconds=round(event.audio_seconds, 3))))
        self._send(se.ItemDone(previous_item_id=turn.previous_item_id, item=item.to_wire()))
        self._release_deferred()

    def _transcript_failed(self, event: TranscriptFailed) -> None:
        """The turn's item stays without words (`error` says why: the model failed, or the policy refused them)."""
        turn = self._committed.get(event.item_id)
        if turn is None or turn.has_text is not None:
            return
        del self._committed[event.item_id]
        if event.refused:
            self._out.append(SendError(event.error))
        item = turn.item
        item.content[0]["transcript"] = ""
        item.status = "incomplete"
        if self.config.audio.input.transcription is not None:
            self._send(se.TranscriptionFailed(item_id=item.id, error=event.error.body()))
        self._send(se.ItemDone(previous_item_id=turn.previous_item_id, item=item.to_wire()))
        self.turns.transcript_final(has_text=False)  # back to listening
        self._out.append(DropTurn(event.item_id))
        self._release_deferred()

    def _transcription_abandoned(self, event: TranscriptionAbandoned) -> None:
        turn = self._committed.get(event.item_id)
        if turn is not None and turn.has_text is None:
            del self._committed[event.item_id]
            self._release_deferred()

    def _turn_ready(self, event: TurnReady) -> None:
        turn = self._committed.pop(event.item_id, None)
        if turn is None or turn.has_text is None:
            return
        if Action.CREATE_RESPONSE not in self.turns.transcript_final(turn.has_text):
            self._out.append(DropTurn(event.item_id))
            return
        if self._queued_turn is not None:  # a newer turn's reply supersedes one still waiting
            self._out.append(DropTurn(self._queued_turn))
            self._queued_turn = None
        if self.response is None:
            self._out.append(CreateResponse(ResponseParams(), turn=event.item_id))
            return
        # A reply still running is about an older turn: it gives way (or, with interrupt_response off, ends first).
        self._queued_turn = event.item_id
        if self.turns.policy.interrupt_response:
            self._interrupt("turn_detected")

    def _release_deferred(self) -> None:
        if not self.transcribing:
            deferred, self._deferred = self._deferred, []
            self._out.extend(CreateResponse(request.params, event_id=request.event_id) for request in deferred)

    # -- responses ---------------------------------------------------------------------------------------

    def _response_requested(self, event: ResponseRequested) -> None:
        if self.config.transcribes_only:
            raise ApiError("invalid_value", "A transcription session creates no responses.", "type")
        if self.transcribing:  # push-to-talk: the response answers what was just committed
            self._deferred.append(event)
            return
        self._out.append(CreateResponse(event.params, event_id=event.event_id))

    def _response_started(self, event: ResponseStarted) -> None:
        self.ensure_no_response()
        events = event.events
        previous = None
        if event.open_message and event.writes_conversation:
            previous = self.conversation.add(events.item)  # conversation_full: refused before anything changed
        if events.audio:
            self._interrupt_playout()  # a new reply replaces whatever is still playing
        self.response = ActiveResponse(events, event.writes_conversation)
        self.turns.response_started()
        if events.audio and self.has_playout:
            self._out.append(SetProducing(True))
            self._speaking = (events.item, events.response_id)
        self._send_all(events.created())
        if event.open_message:
            self._send_all(events.open_item(previous))

    def _tokens_reserved(self, event: TokensReserved) -> None:
        if self._active(event.response_id) is not None:
            self._send(se.RateLimitsUpdated(rate_limits=[event.rate_limit]))

    def _message_opened(self, event: MessageOpened) -> None:
        if (active := self._active(event.response_id)) is not None:
            self._open_message(active)

    def _open_message(self, active: ActiveResponse) -> None:
        events = active.events
        previous = self.conversation.add(events.item) if active.writes_conversation else None
        self._send_all(events.open_item(previous))

    def _function_calls(self, event: FunctionCallsMade) -> None:
        if (active := self._active(event.response_id)) is None:
            return
        for call in event.calls:
            item = Item(id=new_id("item"), type="function_call", call_id=call.id, name=call.name,
                        arguments=call.arguments)
            previous = self.conversation.add(item) if active.writes_conversation else None
            self._send_all(active.events.function_call(item, previous))

    def _text_delta(self, event: TextDelta) -> None:
        if (active := self._active(event.response_id)) is not None:
            self._send_all(active.events.text_delta(event.text))

    def _audio_delta(self, event: AudioDelta) -> None:
        if (active := self._active(event.response_id)) is None:
            return
        if not active.audio_started:
            active.audio_started = True
            self.turns.playback_started(self._now_ms())  # the echo guard starts here
        self._send_all(active.events.audio_delta(event.audio_b64))

    def _speech_written(self, event: SpeechWritten) -> None:
        if (active := self._active(event.response_id)) is not None:
            active.events.item.audio_ms_sent += event.ms

    def _clause_spoken(self, event: ClauseSpoken) -> None:
        if (active := self._active(event.response_id)) is None:
            return
        item = active.events.item
        item.spoken.append(SpokenSegment(event.text, active.clause_start_ms, item.audio_ms_sent))
        active.clause_start_ms = item.audio_ms_sent

    def _metadata_added(self, event: MetadataAdded) -> None:
        if (active := self._active(event.response_id)) is not None:
            active.events.metadata = {**(active.events.metadata or {}), **event.metadata}

    def _cancel_requested(self, event: CancelRequested) -> None:
        active = self.response
        if active is None or (event.response_id is not None and event.response_id != active.events.response_id):
            raise ApiError("response_cancel_not_active", "There is no active response to cancel.")
        self._cancel("client_cancelled", barge_in=False)

    def _cancel(self, reason: str, *, barge_in: bool) -> None:
        """Stop the response: the driver stops its generation and task, then the owner (never the cancelled
        task) feeds ResponseEnded(cancelled), whose tail events end it."""
        active = self.response
        if active is None or active.cancelling:
            return
        active.cancelling = True
        self._out.append(StopResponse(active.events.response_id, reason, barge_in))

    def _response_filtered(self, event: ResponseFiltered) -> None:
        if (active := self._active(event.response_id)) is not None and active.events.audio:
            self._interrupt_playout()

    def _response_ended(self, event: ResponseEnded) -> None:
        active = self._active(event.response_id)
        if active is None:
            return
        self.response = None
        events = active.events
        if event.error is not None:
            self._out.append(SendError(event.error))
        final_text = None
        if events.audio and (event.status == "cancelled" or event.reason == "content_filter"):
            # Trim the interrupted reply to the audio the user got: played (WebRTC) or sent (WebSocket).
            item = events.item
            final_text = item.cut_audio(event.heard_ms if event.heard_ms is not None else item.audio_ms_sent)
        metadata = dict(events.metadata or {})
        # Metadata maps strings to strings (the SDK's type): the marks travel as one compact JSON string.
        metadata["gateway_latency"] = json.dumps(event.latency, separators=(",", ":"))
        events.metadata = metadata
        error = event.error.body() if event.error is not None else None
        self._send_all(events.finish(event.status, reason=event.reason, usage=event.usage, error=error,
                                     final_text=final_text))
        if self.has_playout:
            self._out.append(SetProducing(False))
        if not self.playout_busy:
            self._reply_finished()
        self._out.append(ResponseFinished(events, event.status, event.reason, event.usage, error))
        if self._open is not None and self._open.prefill_due:  # the engine is free for the turn being spoken
            self._prefill(self._open)
        if self._queued_turn is not None:
            turn, self._queued_turn = self._queued_turn, None
            self._out.append(CreateResponse(ResponseParams(), turn=turn))

    def _active(self, response_id: str) -> ActiveResponse | None:
        active = self.response
        return active if active is not None and active.events.response_id == response_id else None

    # -- interruption and playout ------------------------------------------------------------------------

    def _output_clear_requested(self, event: OutputClearRequested) -> None:
        self._interrupt("client_cancelled")

    def _interrupt(self, reason: str) -> None:
        """Barge-in: silence the audio first (within one frame), then cancel and trim the reply."""
        self._interrupt_playout()
        if self.response is not None:
            self._cancel(reason, barge_in=True)
        else:
            self._reply_finished()

    def _interrupt_playout(self) -> None:
        """Drop queued WebRTC audio; a reply that had finished generating is cut to what was heard."""
        if not self.has_playout:
            return
        speaking, self._speaking = self._speaking, None
        if speaking is None:
            self._out.append(ClearPlayout(None))
            return
        item, response_id = speaking
        self._send(se.OutputCleared(response_id=response_id))
        finished = self.response is None or self.response.events.item is not item
        self._unheard = item if finished else None
        self._out.append(ClearPlayout(item.id if finished else None))

    def _playout_cleared(self, event: PlayoutCleared) -> None:
        item, self._unheard = self._unheard, None
        if item is None or item.id != event.item_id:
            return
        heard = item.cut_audio(event.played_ms)
        if item.content:
            item.content[0]["transcript"] = heard
        item.status = "incomplete"
        self._send(se.ItemTruncated(item_id=item.id, content_index=0, audio_end_ms=round(item.audio_ms_sent)))

    def _playout_started(self, event: PlayoutStarted) -> None:
        self.turns.playback_started(self._now_ms())
        self._send(se.OutputStarted(response_id=self._speaking[1] if self._speaking else None))

    def _playout_stopped(self, event: PlayoutStopped) -> None:
        if self._speaking is None or self._speaking[0].id != event.item_id:
            return
        response_id = self._speaking[1]
        self._speaking = None
        self._send(se.OutputStopped(response_id=response_id))
        if self.response is None:
            self._reply_finished()

    def _reply_finished(self) -> None:
        self.turns.reply_finished()
        self._idle_since = self.clock()  # the idle timeout counts from the end of the reply

    # -- helpers -----------------------------------------------------------------------------------------

    def _now_ms(self) -> float:
        return self.clock() * 1000

    def _send(self, event: se.ServerEvent) -> None:
        self._out.append(Send(event.wire()))

    def _send_all(self, events: list[Event]) -> None:
        self._out.extend(Send(event) for event in events)


_TRANSITIONS: dict[type, Callable[[RealtimeCore, Any], None]] = {
    SessionStarted: RealtimeCore._started,
    ConfigChanged: RealtimeCore._config_changed,
    ItemCreated: RealtimeCore._item_created,
    ItemRetrieve: RealtimeCore._item_retrieve,
    ItemDelete: RealtimeCore._item_delete,
    ItemTruncate: RealtimeCore._item_truncate,
    ResponseRequested: RealtimeCore._response_requested,
    CancelRequested: RealtimeCore._cancel_requested,
    OutputClearRequested: RealtimeCore._output_clear_requested,
    AudioCommitted: RealtimeCore._audio_committed,
    AudioCleared: RealtimeCore._audio_cleared,
    SpeechBegan: RealtimeCore._speech_began,
    SpeechEnded: RealtimeCore._speech_ended,
    AudioProcessed: RealtimeCore._audio_processed,
    SilenceHeard: RealtimeCore._silence_heard,
    TranscriptPartial: RealtimeCore._transcript_partial,
    EndOfTurnJudged: RealtimeCore._end_of_turn_judged,
    TranscriptFinal: RealtimeCore._transcript_final,
    TranscriptFailed: RealtimeCore._transcript_failed,
    TranscriptionAbandoned: RealtimeCore._transcription_abandoned,
    TurnReady: RealtimeCore._turn_ready,
    ResponseStarted: RealtimeCore._response_started,
    TokensReserved: RealtimeCore._tokens_reserved,
    MessageOpened: RealtimeCore._message_opened,
    FunctionCallsMade: RealtimeCore._function_calls,
    TextDelta: RealtimeCore._text_delta,
    AudioDelta: RealtimeCore._audio_delta,
    SpeechWritten: RealtimeCore._speech_written,
    ClauseSpoken: RealtimeCore._clause_spoken,
    MetadataAdded: RealtimeCore._metadata_added,
    ResponseFiltered: RealtimeCore._response_filtered,
    ResponseEnded: RealtimeCore._response_ended,
    PlayoutStarted: RealtimeCore._playout_started,
    PlayoutStopped: RealtimeCore._playout_stopped,
    PlayoutCleared: RealtimeCore._playout_cleared,
}
