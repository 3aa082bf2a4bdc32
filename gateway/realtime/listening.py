"""The user's turns as the realtime core sees them: the turn the VAD is hearing (its stable words, what is
prefilled of them, whether its speculative final transcript runs, how long its silence must last with
semantic_vad), the committed turns whose transcripts are still being made, and the response.create calls
that wait for those transcripts (push-to-talk). The core routes these inputs here; what they ask of the rest
of the session (a barge-in, a reply) goes through :class:`ListeningHost`, which the core is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.protocol import server_events as se
from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SemanticVad, SessionConfig, server_vad_wait_ms, turn_end_wait_ms
from gateway.realtime.active_response import ActiveResponse
from gateway.realtime.commands import (
    DiscardSpeculation,
    DropTurn,
    Output,
    PrefillDraft,
    ReplyContext,
    SendError,
    SetSilence,
    StartSpeculation,
    Transcribe,
)
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.inputs import (
    AudioCleared,
    AudioCommitted,
    EndOfTurnJudged,
    ResponseRequested,
    SilenceHeard,
    SpeechBegan,
    SpeechEnded,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptionAbandoned,
    TranscriptPartial,
)
from gateway.realtime.turns import Action, TurnMachine

# The speculative final transcript waits for this much silence: Silero drops below its threshold on a
# word's soft ending ("France" over G.711 came out as "friend" when cut at the first silent window).
SPECULATIVE_SILENCE_MS = 64

ListeningInput = (AudioCommitted | AudioCleared | SpeechBegan | SpeechEnded | SilenceHeard | TranscriptPartial
                  | EndOfTurnJudged | TranscriptFinal | TranscriptFailed | TranscriptionAbandoned)


class Stabilizer(Protocol):
    """The words successive partial transcripts agree on (inference.asr.TranscriptStabilizer)."""

    def update(self, partial: str) -> str: ...


class ListeningHost(Protocol):
    """What the user's turns need of the session's core."""

    config: SessionConfig
    conversation: Conversation
    turns: TurnMachine
    preempts: bool
    judges_server_vad: bool  # server_vad turns are judged by the audio model too (--server-vad-turn-model)
    response: ActiveResponse | None  # the response in progress: it holds the engine

    @property
    def clock(self) -> Callable[[], float]: ...  # seconds, monotonic

    def emit(self, output: Output) -> None: ...

    def emit_event(self, event: se.ServerEvent) -> None: ...

    def barge_in(self, item_id: str) -> None: ...  # speech over the reply, the open turn's

    @property
    def overlap_open(self) -> bool: ...  # speech over the reply is being decided by its words

    def create_response(self, params: ResponseParams, *, answers: ResponseRequested | None = None) -> None: ...

    def reply_context(self, *, excluding: str | None = None) -> ReplyContext: ...

    def heard_silence(self) -> None: ...  # the idle timer counts from now


@dataclass
class _OpenTurn:
    """The user turn the VAD is hearing: its stable words so far, and whether their prefill waits."""

    item_id: str
    stabilizer: Stabilizer
    prefilled: str = ""  # the stable words already prefilled
    prefill_due: bool = False  # a response held the engine: the prefill waits for its end
    speculating: bool = False  # its speculative final transcript (and what follows from it) runs for this silence


@dataclass
class Committed:
    """A committed user turn: its item, until its transcript is final, then whether it has words and how sure
    Whisper was of them."""

    item: Item
    previous_item_id: str | None
    has_text: bool | None = None
    avg_logprob: float | None = None  # the final transcript's (TranscriptFinal)


@dataclass
class Listening:
    """The user's turns. The core passes itself in with each input (no reference back to it, so that a closed
    session is freed by reference counting alone)."""

    stabilizer: Callable[[], Stabilizer]  # one per user turn
    _open: _OpenTurn | None = None  # the user turn the VAD is hearing
    _committed: dict[str, Committed] = field(default_factory=dict)
    _deferred: list[ResponseRequested] = field(default_factory=list)  # response.create waiting for transcripts

    @property
    def open_turn(self) -> str | None:
        """The user item whose speech the VAD is hearing."""
        return self._open.item_id if self._open is not None else None

    @property
    def transcribing(self) -> bool:
        return any(turn.has_text is None for turn in self._committed.values())

    @property
    def deferred(self) -> bool:
        """A response.create waits for committed audio's transcripts (push-to-talk)."""
        return bool(self._deferred)

    def handle(self, event: ListeningInput, host: ListeningHost) -> None:
        _HANDLERS[type(event)](self, event, host)

    def defer(self, request: ResponseRequested) -> None:
        """A response.create that answers what was just committed: it goes out once the transcripts are final."""
        self._deferred.append(request)

    def response_ended(self, host: ListeningHost) -> None:
        """The engine is free for the turn being spoken: its prefill, if it waited."""
        if self._open is not None and self._open.prefill_due:
            self._prefill(self._open, host)

    def take_committed(self, item_id: str) -> Committed | None:
        """TurnReady: the committed turn leaves (None: no such turn)."""
        return self._committed.pop(item_id, None)

    # -- the user's audio ----------------------------------------------------------------------------------

    def _audio_committed(self, event: AudioCommitted, host: ListeningHost) -> None:
        if self._open is not None:  # the commit ends the turn the VAD had started
            self._open = None
            if Action.COMMIT not in host.turns.speech_stopped():
                return
        self._commit(event.item_id, host)  # refused (conversation_full): the client's event gets the error

    def _audio_cleared(self, event: AudioCleared, host: ListeningHost) -> None:
        self._open = None
        host.emit_event(se.InputCleared())

    def _speech_began(self, event: SpeechBegan, host: ListeningHost) -> None:
        self._open = turn = _OpenTurn(event.item_id, self.stabilizer())
        host.emit_event(se.SpeechStarted(audio_start_ms=event.audio_start_ms, item_id=event.item_id))
        if Action.INTERRUPT in host.turns.speech_started(host.clock() * 1000):
            host.barge_in(turn.item_id)
        self._prefill(turn, host)  # the conversation so far: after a barge-in, once the reply has ended

    def _prefill(self, turn: _OpenTurn, host: ListeningHost) -> None:
        if host.config.transcribes_only:
            return  # a transcription session never answers: nothing to prefill for
        turn.prefill_due = host.response is not None  # it holds the engine, and may still add to the conversation
        if not turn.prefill_due:
            host.emit(PrefillDraft(turn.item_id, turn.prefilled, host.reply_context()))

    def _speech_ended(self, event: SpeechEnded, host: ListeningHost) -> None:
        if self.open_turn != event.item_id:
            return
        self._open = None
        host.emit_event(se.SpeechStopped(audio_end_ms=event.audio_end_ms, item_id=event.item_id))
        host.heard_silence()
        if Action.COMMIT not in host.turns.speech_stopped():
            return
        try:
            self._commit(event.item_id, host)
        except ApiError as error:  # the conversation is full: the turn is not kept, the session goes on
            host.emit(DropTurn(event.item_id))
            host.turns.transcript_final(has_text=False)  # back to listening
            host.emit(SendError(error))

    def _commit(self, item_id: str, host: ListeningHost) -> None:
        """The user item joins the conversation in the same step as the commit; its transcript follows."""
        conversation = host.conversation
        previous = conversation.items[-1].id if len(conversation) else None
        item = Item(id=item_id, type="message", role="user", status="in_progress",
                    content=[{"type": "input_audio", "transcript": None}])
        conversation.add(item)
        self._committed[item_id] = Committed(item, previous)
        host.emit_event(se.InputCommitted(previous_item_id=previous, item_id=item_id))
        host.emit_event(se.ItemAdded(previous_item_id=previous, item=item.to_wire()))
        host.emit(Transcribe(item_id))

    def _silence_heard(self, event: SilenceHeard, host: ListeningHost) -> None:
        """A silence long enough starts the speculative final transcript, unless one running reaches this far;
        speech again discards it (and what was started from it)."""
        turn = self._open
        if turn is None or turn.item_id != event.item_id:
            return
        detection = host.config.audio.input.turn_detection
        if event.silence_ms is not None and event.silence_ms >= SPECULATIVE_SILENCE_MS:
            # Over a reply the speculative transcript is what decides the speech: it runs even where a partial
            # covers the speech, whose words come without Whisper's confidence.
            if not turn.speculating and (not event.covered or host.overlap_open):
                turn.speculating = True
                # A reply made ahead from words spoken over a reply would answer "yeah" (or half of "stop, ..."):
                # it would only take cores from the transcript that decides the reply.
                preempt = (host.preempts and detection is not None and detection.create_response
                           and not host.overlap_open)
                judged = isinstance(detection, SemanticVad) or (detection is not None and host.judges_server_vad)
                context = host.reply_context(excluding=turn.item_id) if preempt else None
                host.emit(StartSpeculation(turn.item_id, preempt, judged, context))
        elif event.speech and turn.speculating:
            turn.speculating = False
            host.emit(DiscardSpeculation(turn.item_id))

    # -- transcripts ------------------------------------------------------------------------------------------

    def _transcript_partial(self, event: TranscriptPartial, host: ListeningHost) -> None:
        """The words two partials agree on are stable: the new ones are the delta, and are prefilled."""
        turn = self._open
        if turn is None or turn.item_id != event.item_id:
            return  # the turn ended while it was transcribed
        stable = turn.stabilizer.update(event.text)
        # A later partial may revise a stable word: nothing new then, until they agree past what was sent.
        delta = stable[len(turn.prefilled):] if stable.startswith(turn.prefilled) else ""
        if delta:
            turn.prefilled = stable
            self._prefill(turn, host)
        if host.config.audio.input.transcription is not None:  # null: transcription events are off
            host.emit_event(se.TranscriptionDelta(item_id=event.item_id, delta=delta, text=event.text))

    def _end_of_turn_judged(self, event: EndOfTurnJudged, host: ListeningHost) -> None:
        detection = host.config.audio.input.turn_detection
        if self.open_turn != event.item_id or detection is None:
            return
        if isinstance(detection, SemanticVad):
            host.emit(SetSilence(event.item_id, turn_end_wait_ms(detection.eagerness, audio=event.audio, text=event.text,
                                                                 words_sure=event.words_sure)))
        elif host.judges_server_vad and event.audio is not None:
            host.emit(SetSilence(event.item_id, server_vad_wait_ms(detection.silence_duration_ms, event.audio)))

    def _transcript_final(self, event: TranscriptFinal, host: ListeningHost) -> None:
        turn = self._committed.get(event.item_id)
        if turn is None or turn.has_text is not None:
            return
        turn.has_text = bool(event.text.strip())
        turn.avg_logprob = event.avg_logprob
        item = turn.item
        item.content[0]["transcript"] = event.text
        item.status = "completed"
        if host.config.audio.input.transcription is not None:
            host.emit_event(se.TranscriptionCompleted(
                item_id=item.id, transcript=event.text, usage=se.TranscriptionUsage(seconds=round(event.audio_seconds, 3))))
        host.emit_event(se.ItemDone(previous_item_id=turn.previous_item_id, item=item.to_wire()))
        self._release_deferred(host)

    def _transcript_failed(self, event: TranscriptFailed, host: ListeningHost) -> None:
        """The turn's item stays without words (`error` says why: the model failed, or the policy refused them)."""
        turn = self._committed.get(event.item_id)
        if turn is None or turn.has_text is not None:
            return
        del self._committed[event.item_id]
        if event.refused:
            host.emit(SendError(event.error))
        item = turn.item
        item.content[0]["transcript"] = ""
        item.status = "incomplete"
        if host.config.audio.input.transcription is not None:
            host.emit_event(se.TranscriptionFailed(item_id=item.id, error=event.error.body()))
        host.emit_event(se.ItemDone(previous_item_id=turn.previous_item_id, item=item.to_wire()))
        host.turns.transcript_final(has_text=False)  # back to listening
        host.emit(DropTurn(event.item_id))
        self._release_deferred(host)

    def _transcription_abandoned(self, event: TranscriptionAbandoned, host: ListeningHost) -> None:
        turn = self._committed.get(event.item_id)
        if turn is not None and turn.has_text is None:
            del self._committed[event.item_id]
            self._release_deferred(host)

    def _release_deferred(self, host: ListeningHost) -> None:
        if not self.transcribing:
            deferred, self._deferred = self._deferred, []
            for request in deferred:
                host.create_response(request.params, answers=request)


_HANDLERS: dict[type, Callable[[Listening, Any, ListeningHost], None]] = {
    AudioCommitted: Listening._audio_committed,
    AudioCleared: Listening._audio_cleared,
    SpeechBegan: Listening._speech_began,
    SpeechEnded: Listening._speech_ended,
    SilenceHeard: Listening._silence_heard,
    TranscriptPartial: Listening._transcript_partial,
    EndOfTurnJudged: Listening._end_of_turn_judged,
    TranscriptFinal: Listening._transcript_final,
    TranscriptFailed: Listening._transcript_failed,
    TranscriptionAbandoned: Listening._transcription_abandoned,
}
