"""The Realtime session's turn and response state, with no I/O (as websockets' protocol.py and h11's _state.py).

`RealtimeCore.handle(input)` takes one typed input (inputs.py: a parsed client event, a VAD edge, a
transcript, an engine delta or result, a playout mark, an audio tick) and returns what to do, in order
(commands.py): events to send (`Send`, built by protocol/server_events.py and ResponseEvents) and commands
for the drivers (session.py, voice.py, responses.py) to carry out (`StopResponse`, `CreateResponse`,
`ClearPlayout`, `Transcribe`, `StartSpeculation`...).

One table (`_TRANSITIONS`) maps (session state, input type) to its transition: NEW takes SessionStarted
only, OPEN every other input; an input the table lacks raises IllegalInput (a driver's bug: nothing
changes, the session logs it and goes on), a refused client event raises ApiError. The response in
progress is a sub-machine (active_response.py: IN_PROGRESS, CANCELLING) to which the core routes each of
its inputs by id; an input for a response that ended is a straggler and dropped, one for an id never in
progress is illegal. A state change and the events announcing it come out of one call, so no other input
sees half of it. Some commands come back as inputs when done: `StopResponse` as `ResponseEnded`
(cancelled), `ClearPlayout` as `PlayoutCleared` (what was heard).

It owns: the conversation, the turn machine (turns.py, driven from here only), the user turn the VAD
has open (its stable words, what is prefilled of it, whether its speculative final transcript runs, how
long its silence must last with semantic_vad), the committed turns still being transcribed, the response
in progress (ResponseEvents), the reply whose audio is playing, the turn reply waiting for the current one
to end, and the idle timer.
The driver owns the tasks, the models, the buffers and the clock it passes in.
"""

from __future__ import annotations

import enum
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.protocol import server_events as se
from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SemanticVad, SessionConfig, semantic_wait_ms
from gateway.realtime.active_response import ActiveResponse, ResponseInput
from gateway.realtime.commands import (
    ClearPlayout,
    CreateResponse,
    DiscardSpeculation,
    DropTurn,
    Output,
    PrefillDraft,
    ResponseFinished,
    Send,
    SendError,
    SetProducing,
    SetSilence,
    StartSpeculation,
    StopResponse,
    Transcribe,
)
from gateway.realtime.conversation import Conversation, Item, new_id
from gateway.realtime.inputs import (
    AudioCleared,
    AudioCommitted,
    AudioDelta,
    AudioProcessed,
    CancelRequested,
    ClauseSpoken,
    ConfigChanged,
    EndOfTurnJudged,
    FunctionCallsMade,
    IllegalInput,
    Input,
    ItemCreated,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    MessageOpened,
    MetadataAdded,
    OutputClearRequested,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    ResponseEnded,
    ResponseFiltered,
    ResponseRequested,
    ResponseStarted,
    SessionStarted,
    SilenceHeard,
    SpeechBegan,
    SpeechEnded,
    SpeechWritten,
    TextDelta,
    TokensReserved,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptionAbandoned,
    TranscriptPartial,
    TurnReady,
)
from gateway.realtime.response_events import Event
from gateway.realtime.turns import Action, TurnMachine, TurnPolicy

# The speculative final transcript waits for this much silence: Silero drops below its threshold on a
# word's soft ending ("France" over G.711 came out as "friend" when cut at the first silent window).
SPECULATIVE_SILENCE_MS = 64
IDLE_NUDGE = "The user has been silent for a while. Briefly ask whether they are still there."


class SessionState(enum.Enum):
    NEW = "new"  # before SessionStarted: nothing else is legal
    OPEN = "open"  # session.created was sent


# Ended responses the core still recognizes: a straggler of theirs is stale and dropped, an unknown id is illegal.
ENDED_RESPONSES_KEPT = 16


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
    state: SessionState = SessionState.NEW
    response: ActiveResponse | None = None  # the response sub-machine, while one is in progress
    _ended: deque[str] = field(default_factory=lambda: deque(maxlen=ENDED_RESPONSES_KEPT))
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
        that is refused (nothing changed), IllegalInput for an input the state cannot take (a driver's bug;
        nothing changed); every other failure is an output."""
        transition = _TRANSITIONS.get((self.state, type(event)))
        if transition is None:
            raise IllegalInput(f"{type(event).__name__} in session state {self.state.value}")
        self._out = []
        transition(self, event)
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
        self.state = SessionState.OPEN
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

    def _response_input(self, event: ResponseInput) -> None:
        """Routed to the response it names; what the session does beside comes first (as the audio is sent)."""
        active = self._route(event.response_id)
        if active is None:
            return
        if isinstance(event, AudioDelta) and not active.audio_started:
            self.turns.playback_started(self._now_ms())  # the echo guard starts here
        elif isinstance(event, ResponseFiltered) and active.events.audio:
            self._interrupt_playout()
        self._out.extend(active.handle(event, self.conversation))

    def _cancel_requested(self, event: CancelRequested) -> None:
        active = self.response
        if active is None or (event.response_id is not None and event.response_id != active.events.response_id):
            raise ApiError("response_cancel_not_active", "There is no active response to cancel.")
        self._cancel("client_cancelled", barge_in=False)

    def _cancel(self, reason: str, *, barge_in: bool) -> None:
        """Stop the response: the driver stops its generation and task, then the owner (never the cancelled
        task) feeds ResponseEnded(cancelled), whose tail events end it."""
        active = self.response
        if active is not None and active.cancel():
            self._out.append(StopResponse(active.response_id, reason, barge_in))

    def _response_ended(self, event: ResponseEnded) -> None:
        active = self._route(event.response_id)
        if active is None:
            return
        self.response = None
        self._ended.append(active.response_id)
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

    def _route(self, response_id: str) -> ActiveResponse | None:
        """The response in progress with this id; None for one that has ended (a straggler of its task)."""
        active = self.response
        if active is not None and active.response_id == response_id:
            return active
        if response_id in self._ended:
            return None
        raise IllegalInput(f"an input for response {response_id}, which was never in progress")

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


# (state, input) -> transition. A response's own inputs go on to its sub-machine (active_response.py).
_OPEN: dict[type, Callable[[RealtimeCore, Any], None]] = {
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
    TokensReserved: RealtimeCore._response_input,
    MessageOpened: RealtimeCore._response_input,
    FunctionCallsMade: RealtimeCore._response_input,
    TextDelta: RealtimeCore._response_input,
    AudioDelta: RealtimeCore._response_input,
    SpeechWritten: RealtimeCore._response_input,
    ClauseSpoken: RealtimeCore._response_input,
    MetadataAdded: RealtimeCore._response_input,
    ResponseFiltered: RealtimeCore._response_input,
    ResponseEnded: RealtimeCore._response_ended,
    PlayoutStarted: RealtimeCore._playout_started,
    PlayoutStopped: RealtimeCore._playout_stopped,
    PlayoutCleared: RealtimeCore._playout_cleared,
}
_TRANSITIONS: dict[tuple[SessionState, type], Callable[[RealtimeCore, Any], None]] = {
    (SessionState.NEW, SessionStarted): RealtimeCore._started,
    **{(SessionState.OPEN, kind): transition for kind, transition in _OPEN.items()},
}
