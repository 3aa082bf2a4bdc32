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

It owns: the conversation, the turn machine (turns.py, driven from here only), the turn reply waiting for
the current one to end, the notes to say when free (ReplyWhenFree: a rule checked after every input, so no
driver polls the core), and the idle timer; and three sub-machines it routes inputs to: the user's turns
(listening.py: the turn the VAD is hearing, the committed turns being transcribed, response.create waiting
for them), the response in progress (active_response.py), and WebRTC's playout (playout_state.py: the reply
queued or playing, a cut reply waiting for what was heard).
The drivers own the tasks, the models, the buffers and the clock passed in.
"""

from __future__ import annotations

import enum
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol import server_events as se
from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig
from gateway.realtime.active_response import ActiveResponse, ResponseInput, already_active
from gateway.realtime.barge_in import PausedReply
from gateway.realtime.commands import (
    ConfigureListening,
    CreateResponse,
    DropTurn,
    Output,
    ReplyContext,
    ResponseFinished,
    ResponseSession,
    Send,
    SendError,
    SetProducing,
    StopResponse,
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
    ConversationAttached,
    EndOfTurnJudged,
    ErrorOccurred,
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
    PlayoutAttached,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    ReplyWhenFree,
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
    TranscriptSpeculated,
    TurnReady,
)
from gateway.realtime.listening import Listening, ListeningInput, Stabilizer
from gateway.realtime.playout_state import PlayoutInput, PlayoutView
from gateway.realtime.turns import Action, TurnMachine, TurnPolicy

IDLE_NUDGE = "The user has been silent for a while. Briefly ask whether they are still there."


class SessionState(enum.Enum):
    NEW = "new"  # before SessionStarted: nothing else is legal
    OPEN = "open"  # session.created was sent


# Ended responses the core still recognizes: a straggler of theirs is stale and dropped, an unknown id is illegal.
ENDED_RESPONSES_KEPT = 16


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
    judges_server_vad: bool = False  # the audio model lengthens an unfinished server_vad turn's silence
    resumes_false_interruptions: bool = False  # WebRTC: a backchannel over the reply pauses it, then it plays on
    listens: bool = False  # from SessionStarted: a voice pipeline takes the input settings (ConfigureListening)
    turns: TurnMachine = field(default_factory=TurnMachine)
    state: SessionState = SessionState.NEW
    response: ActiveResponse | None = None  # the response sub-machine, while one is in progress
    _ended: deque[str] = field(default_factory=lambda: deque(maxlen=ENDED_RESPONSES_KEPT))
    _listening: Listening = field(init=False)  # the user's turns
    _queued_turn: str | None = None  # a turn's reply waiting for the response in progress to end
    _when_free: deque[ReplyWhenFree] = field(default_factory=deque)  # notes to say once nobody speaks
    _playout: PlayoutView = field(default_factory=PlayoutView)  # WebRTC: the reply queued or playing
    _paused: PausedReply = field(default_factory=PausedReply)  # WebRTC: the reply paused by speech over it
    _idle_since: float = 0.0
    _out: list[Output] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listening = Listening(self.stabilizer)
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
        if self._when_free:
            self._reply_when_free()
        out, self._out = self._out, []
        return out

    @property
    def free(self) -> bool:
        """Nobody speaks, and nobody is about to: no response is in progress or commanded by this input (the
        driver starts a commanded one, or refuses it, before the next input), no reply plays, and the user is
        neither talking nor waiting for a transcript or a push-to-talk reply."""
        return (self.response is None and not self._playout.busy
                and self._listening.open_turn is None and not self._listening.transcribing
                and not any(isinstance(o, CreateResponse) for o in self._out))

    @property
    def open_turn(self) -> str | None:
        """The user item whose speech the VAD is hearing."""
        return self._listening.open_turn

    @property
    def deferred_responses(self) -> bool:
        """A response.create waits for committed audio's transcripts (push-to-talk)."""
        return self._listening.deferred

    @property
    def playout_busy(self) -> bool:
        return self._playout.busy

    def create_response(self, params: ResponseParams, *, answers: ResponseRequested | None = None,
                        turn: str | None = None) -> None:
        """Command a response, with what the driver plans it from: a client's (`answers`), a turn's, the nudge."""
        self._out.append(CreateResponse(params, event_id=answers.event_id if answers is not None else None, turn=turn,
                                        session=ResponseSession(self.config, self.conversation, self.can_speak),
                                        answers=answers))

    def reply_context(self, *, excluding: str | None = None) -> ReplyContext:
        """What a reply made ahead of the turn `excluding` is built from (PrefillDraft, StartSpeculation)."""
        return ReplyContext(self.config, self.conversation.chat_messages(self.config.instructions, excluding=excluding),
                            "audio" in self.config.output_modalities and self.can_speak, self.conversation.id)

    # -- session and items ---------------------------------------------------------------------------

    def _attached(self, event: ConversationAttached | PlayoutAttached) -> None:
        """Before the session starts: a stored conversation to continue, or a WebRTC playout."""
        if isinstance(event, ConversationAttached):
            self.conversation = event.conversation
        else:
            self.has_playout = True

    def _started(self, event: SessionStarted) -> None:
        self.state = SessionState.OPEN
        self._idle_since = self.clock()
        self.emit_event(se.SessionCreated(session=self.config.to_wire(), resume_token=event.resume_token))
        previous = None
        for item in self.conversation.items:  # a stored conversation's branch
            self.emit_event(se.ItemAdded(previous_item_id=previous, item=item.to_wire()))
            self.emit_event(se.ItemDone(previous_item_id=previous, item=item.to_wire()))
            previous = item.id
        self.listens = event.listens
        self._apply_policy()

    def _config_changed(self, event: ConfigChanged) -> None:
        config = event.config
        if config.type != self.config.type and (len(self.conversation) or self.response is not None):
            raise ApiError("invalid_value", f"A {self.config.type} session becomes a {config.type} one only before its "
                           "first item.", "session.type")
        if config.wants_audio() and not config.transcribes_only and not self.can_speak:
            raise ApiError("invalid_value", "Audio output needs the voice models (start without --no-load-voice-models).",
                           "session.output_modalities")
        self.config = config
        self.emit_event(se.SessionUpdated(session=config.to_wire()))
        self._apply_policy()

    def _apply_policy(self) -> None:
        """The configuration's input settings: the turns' policy here, the rest in the voice pipeline."""
        detection = self.config.audio.input.turn_detection
        self.turns.policy = TurnPolicy(
            create_response=detection.create_response if detection else False,
            interrupt_response=detection.interrupt_response if detection else False,
            echo_guard_ms=self.echo_guard_ms,
        )
        if self.listens:
            self._out.append(ConfigureListening(self.config.audio.input))

    def _item_op(self, event: ItemCreated | ItemRetrieve | ItemDelete | ItemTruncate) -> None:
        """A client's conversation.item.* event on the conversation; a refused one raises ApiError."""
        match event:
            case ItemCreated():
                previous = self.conversation.add(event.item, event.previous_item_id)
                self.emit_event(se.ItemAdded(previous_item_id=previous, item=event.item.to_wire()))
                self.emit_event(se.ItemDone(previous_item_id=previous, item=event.item.to_wire()))
            case ItemRetrieve():
                self.emit_event(se.ItemRetrieved(item=self.conversation.get(event.item_id).to_wire()))
            case ItemDelete():
                if self.response is not None and self.response.events.item.id == event.item_id:
                    raise ApiError("item_in_use", "The item belongs to the response in progress; cancel it first.",
                                   "item_id")
                self.conversation.delete(event.item_id)
                self.emit_event(se.ItemDeleted(item_id=event.item_id))
            case ItemTruncate():
                item = self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
                self.emit_event(se.ItemTruncated(item_id=item.id, content_index=event.content_index,
                                                 audio_end_ms=round(item.audio_ms_sent)))

    # -- user audio and turns --------------------------------------------------------------------------

    def _listen(self, event: ListeningInput) -> None:
        self._listening.handle(event, self)

    def _audio_processed(self, event: AudioProcessed) -> None:
        open_turn = self._listening.open_turn
        if open_turn is not None:
            if Action.INTERRUPT in self.turns.tick(self.clock() * 1000, user_speaking=True):
                self.barge_in(open_turn)
            self._paused.voiced(self, open_turn, event.turn_voiced_ms)
            return
        self._paused.tick(self)
        detection = self.config.audio.input.turn_detection
        if detection is None or detection.idle_timeout_ms is None or self.response is not None or self.playout_busy:
            return
        if self.clock() - self._idle_since < detection.idle_timeout_ms / 1000:
            return
        self._idle_since = self.clock()
        # As OpenAI does: the silence becomes an empty user turn, and the reply checks on the user.
        item = Item(id=new_id("item"), type="message", role="user", content=[{"type": "input_audio", "transcript": ""}])
        self.emit_event(se.TimeoutTriggered(audio_start_ms=event.audio_end_ms, audio_end_ms=event.audio_end_ms,
                                       item_id=item.id))
        self._item_op(ItemCreated(item))
        if detection.create_response:
            nudge = f"{self.config.instructions}\n\n{IDLE_NUDGE}".strip()
            self.create_response(ResponseParams(instructions=nudge))

    def _turn_ready(self, event: TurnReady) -> None:
        turn = self._listening.take_committed(event.item_id)
        if turn is None or turn.has_text is None:  # no such turn, or no transcript
            return
        if self._paused.turn_ready(self, event.item_id, turn.avg_logprob):  # a backchannel: the reply plays on
            self.turns.transcript_final(False)
            self._out.append(DropTurn(event.item_id))
            return
        if Action.CREATE_RESPONSE not in self.turns.transcript_final(turn.has_text):
            self._out.append(DropTurn(event.item_id))
            return
        if self._queued_turn is not None:  # a newer turn's reply supersedes one still waiting
            self._out.append(DropTurn(self._queued_turn))
            self._queued_turn = None
        if self.response is None:
            self.create_response(ResponseParams(), turn=event.item_id)
            return
        # A reply still running is about an older turn: it gives way (or, with interrupt_response off, ends first).
        self._queued_turn = event.item_id
        if self.turns.policy.interrupt_response:
            self.interrupt("turn_detected")

    # -- responses ---------------------------------------------------------------------------------------

    def _response_requested(self, event: ResponseRequested) -> None:
        if self.config.transcribes_only:
            raise ApiError("invalid_value", "A transcription session creates no responses.", "type")
        if self._listening.transcribing:  # push-to-talk: the response answers what was just committed
            self._listening.defer(event)
            return
        self.create_response(event.params, answers=event)

    def _response_started(self, event: ResponseStarted) -> None:
        if self.response is not None:
            raise already_active(self.response.events.response_id)
        events = event.events
        previous = None
        if event.open_message and event.writes_conversation:
            previous = self.conversation.add(events.item)  # conversation_full: refused before anything changed
        if events.audio:
            self._interrupt_playout()  # a new reply replaces whatever is still playing
        self.response = ActiveResponse(events, event.writes_conversation)
        self.turns.response_started()
        if events.audio and self.has_playout:
            self._out.extend(self._playout.speak(events.item, events.response_id))
        self._out.extend(Send(e) for e in events.created())
        if event.open_message:
            self._out.extend(Send(e) for e in events.open_item(previous))

    def _response_input(self, event: ResponseInput) -> None:
        """Routed to the response it names; what the session does beside comes first (as the audio is sent)."""
        active = self._route(event.response_id)
        if active is None:
            return
        if isinstance(event, AudioDelta) and not active.audio_started:
            self.turns.playback_started(self.clock() * 1000)  # the echo guard starts here
        elif isinstance(event, ResponseFiltered) and active.events.audio:
            self._interrupt_playout()
        self._out.extend(active.handle(event, self.conversation))

    def _reply_when_free(self) -> None:
        """The rule that speaks a waiting note, checked after every input: once the session is free, the oldest
        note is added to the conversation and a reply is asked for (a refused note, a full conversation, is an
        `error` event, and the next note waits its turn)."""
        if not self.free:
            return
        note = self._when_free.popleft()
        try:
            self._item_op(ItemCreated(note.note))
        except ApiError as error:
            self._out.append(SendError(error))
            return
        self.create_response(note.params)

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
        self._out.extend(Send(e) for e in events.finish(event.status, reason=event.reason, usage=event.usage, error=error,
                                     final_text=final_text))
        if self.has_playout:
            self._out.append(SetProducing(False))
            if events.audio and events.item.audio_ms_sent == 0:  # no audio (a function call): none will play out
                self._playout.silent(events.item)
        if not self.playout_busy:
            self._reply_finished()
        self._out.append(ResponseFinished(events, event.status, event.reason, event.usage, error))
        self._listening.response_ended(self)
        if self._queued_turn is not None:
            turn, self._queued_turn = self._queued_turn, None
            self.create_response(ResponseParams(), turn=turn)

    def _route(self, response_id: str) -> ActiveResponse | None:
        """The response in progress with this id; None for one that has ended (a straggler of its task)."""
        active = self.response
        if active is not None and active.response_id == response_id:
            return active
        if response_id in self._ended:
            return None
        raise IllegalInput(f"an input for response {response_id}, which was never in progress")

    # -- interruption and playout ------------------------------------------------------------------------

    def _interrupt_playout(self) -> None:
        """Drop queued WebRTC audio; a reply that had finished generating is cut to what was heard. A hold of it by
        speech over it ends there (barge_in.py)."""
        self._paused.reset(self)
        if self.has_playout:
            self._out.extend(self._playout.clear(self.response.events.item if self.response is not None else None))

    def _playout_input(self, event: PlayoutInput) -> None:
        """WebRTC's playout marks: its first audio starts the echo guard; a reply played out ends the assistant's turn."""
        if isinstance(event, PlayoutStarted):
            self.turns.playback_started(self.clock() * 1000)
        played_out = self._playout.handle(event, self._out)
        if played_out and self.response is None:
            self._reply_finished()

    def _reply_finished(self) -> None:
        self.turns.reply_finished()
        self._idle_since = self.clock()  # the idle timeout counts from the end of the reply

    # -- helpers -----------------------------------------------------------------------------------------

    # What the sub-machines (listening.py) ask of the core.
    def emit(self, output: Output) -> None:
        self._out.append(output)

    def emit_event(self, event: se.ServerEvent) -> None:
        self._out.append(Send(event.wire()))

    def barge_in(self, item_id: str) -> None:
        """Speech over the reply (the open turn `item_id`'s): paused until the words decide (barge_in.py), or
        interrupted at once."""
        self._paused.speech(self, item_id)

    @property
    def overlap_open(self) -> bool:
        """Speech over the reply is being decided (the reply held, or playing on over words judged a backchannel
        so far): its speculative transcripts decide it."""
        return self._paused.open

    def _transcript_speculated(self, event: TranscriptSpeculated) -> None:
        self._paused.words(self, event.item_id, event.text, event.avg_logprob)

    def interrupt(self, reason: str) -> None:
        """Barge-in: silence the audio first (within one frame), then cancel and trim the reply."""
        self._interrupt_playout()
        if self.response is not None:
            self._cancel(reason, barge_in=True)
        else:
            self._reply_finished()

    def heard_silence(self) -> None:
        self._idle_since = self.clock()



# (state, input) -> transition. A response's own inputs go on to its sub-machine (active_response.py).
_OPEN: dict[type, Callable[[RealtimeCore, Any], None]] = {
    ConfigChanged: RealtimeCore._config_changed,
    ErrorOccurred: lambda core, event: core.emit(SendError(event.error)),
    ItemCreated: RealtimeCore._item_op,
    ItemRetrieve: RealtimeCore._item_op,
    ItemDelete: RealtimeCore._item_op,
    ItemTruncate: RealtimeCore._item_op,
    ResponseRequested: RealtimeCore._response_requested,
    ReplyWhenFree: lambda core, event: core._when_free.append(event),
    CancelRequested: RealtimeCore._cancel_requested,
    OutputClearRequested: lambda core, event: core.interrupt("client_cancelled"),
    AudioCommitted: RealtimeCore._listen,
    AudioCleared: RealtimeCore._listen,
    SpeechBegan: RealtimeCore._listen,
    SpeechEnded: RealtimeCore._listen,
    AudioProcessed: RealtimeCore._audio_processed,
    SilenceHeard: RealtimeCore._listen,
    TranscriptPartial: RealtimeCore._listen,
    EndOfTurnJudged: RealtimeCore._listen,
    TranscriptSpeculated: RealtimeCore._transcript_speculated,
    TranscriptFinal: RealtimeCore._listen,
    TranscriptFailed: RealtimeCore._listen,
    TranscriptionAbandoned: RealtimeCore._listen,
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
    PlayoutStarted: RealtimeCore._playout_input,
    PlayoutStopped: RealtimeCore._playout_input,
    PlayoutCleared: RealtimeCore._playout_input,
}
_TRANSITIONS: dict[tuple[SessionState, type], Callable[[RealtimeCore, Any], None]] = {
    (SessionState.NEW, ConversationAttached): RealtimeCore._attached,
    (SessionState.NEW, PlayoutAttached): RealtimeCore._attached,
    (SessionState.NEW, SessionStarted): RealtimeCore._started,
    **{(SessionState.OPEN, kind): transition for kind, transition in _OPEN.items()},
}
