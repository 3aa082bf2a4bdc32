"""One Realtime conversation's driver: it feeds what happens to its realtime core and carries out the core's
commands (events to the outbox, responses to ResponseDriver, transcriptions to VoicePipeline, the playout).

Transports (WebSocket, WebRTC data channel) feed raw client messages to `receive()` and drain `outbox`.
The turn and response state, and the events announcing its changes, come from `RealtimeCore` (core.py) in
one step each; the responses' tasks are ResponseDriver's (responses.py), the listening side's VoicePipeline's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from gateway.generation.memory import MemoryAccount
from gateway.generation.runtime import Runtime
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.platform.latency import TurnMarks, now
from gateway.platform.token_quota import TokenAccount
from gateway.protocol import client_events as ev
from gateway.protocol import server_events as se
from gateway.protocol.codec import decode_client_event
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import (
    SessionConfig,
    TurnDetection,
    apply_session_update,
)
from gateway.realtime.active_response import ActiveResponse
from gateway.realtime.commands import (
    ClearPlayout,
    ConfigureListening,
    CreateResponse,
    DiscardSpeculation,
    DropTurn,
    HoldPlayout,
    Output,
    PauseEnded,
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
from gateway.realtime.conversation import Conversation, Item, item_from_param, new_id, screen_item
from gateway.realtime.core import RealtimeCore
from gateway.realtime.head_start import HeadStart
from gateway.realtime.inputs import (
    CancelRequested,
    ConfigChanged,
    ConversationAttached,
    IllegalInput,
    Input,
    ItemCreated,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputClearRequested,
    PlayoutAttached,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    ResponseRequested,
    SessionStarted,
)
from gateway.realtime.outbox import Outbox, SlowConsumer
from gateway.realtime.recorder import ConversationRecorder
from gateway.realtime.reply_ahead import ReplyAhead
from gateway.realtime.response_driver import ResponseDriver
from gateway.realtime.response_events import Event
from gateway.realtime.response_plan import Accounts
from gateway.realtime.speech_out import SpeechFactory
from gateway.realtime.voice import VoicePipeline
from inference.asr import TranscriptStabilizer
from media.playout import PlayoutBuffer

log = logging.getLogger(__name__)

DTMF_DIGITS = "0123456789*#ABCD"
TransportKind = Literal["websocket", "webrtc", "live", "twilio", "telnyx", "plivo", "sip"]
PHONE_TRANSPORTS = ("twilio", "telnyx", "plivo", "sip")  # their audio is G.711 at 8 kHz: the narrowband VAD listens
# A protocol's words for the core's (Realtime) events: Live's (live_wire.py); Realtime's are sent as they are.
Translate = Callable[[Event], list[Event]]


class Inbox:
    """Where the session's drivers feed what they learn: to the session while it is open. Closing it drops
    what comes later (a straggling task's input) and lets go of the session, the drivers' only way back to it:
    once closed, nothing they hold refers to the session, which reference counting then frees."""

    def __init__(self, deliver: Callable[[Input], None]) -> None:
        self._deliver: Callable[[Input], None] | None = deliver

    def feed(self, event: Input) -> None:
        if self._deliver is not None:
            self._deliver(event)

    def close(self) -> None:
        self._deliver = None


class RealtimeSession:
    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        *,
        transport: TransportKind,
        speech_factory: SpeechFactory | None,
        initial_config: dict[str, Any] | None = None,
        request_id: str | None = None,
        session_id: str | None = None,  # the id its client secret announced, or one naming its replica (Live)
        outbox: Outbox | None = None,
        translate: Translate | None = None,
    ) -> None:
        self.runtime = runtime
        self.request_id = request_id  # the handshake's (or call offer's) X-Request-ID, for the log
        self.settings = settings
        self.transport = transport
        self.speech_factory = speech_factory
        self.id = session_id or new_id("sess")
        self.outbox = outbox if outbox is not None else Outbox(
            replay_bytes=settings.resume_buffer_bytes if settings.resume_window_s > 0 else 0)
        self._translate = translate
        # Reconnecting with it (and the last sequence number received) resumes this session: SessionHub.
        # Names the replica, so that a resume reaching another one is relayed here (transports/realtime_ws.py).
        self.resume_token = f"{settings.replica_id}.{secrets.token_urlsafe(24)}"
        self.close_frame: tuple[int, str] = (1000, "")  # how its WebSocket closes when the session ends
        default_modality = "audio" if runtime.voice_ready and speech_factory is not None else "text"
        config = SessionConfig(
            id=self.id,
            model=settings.model_name,
            instructions=settings.default_instructions,
            output_modalities=[default_modality],
            max_output_tokens=settings.default_max_tokens,
            expires_at=int(time.time() + settings.max_session_duration_s),
        )
        speech = runtime.speech_options
        config.audio.input.turn_detection = TurnDetection(silence_duration_ms=settings.vad_silence_duration_ms)
        speech.apply_defaults(config)
        if initial_config:
            config = apply_session_update(config, initial_config, speech=speech)
        self.core = RealtimeCore(
            config, Conversation(max_items=settings.max_conversation_items, max_bytes=settings.max_conversation_bytes),
            clock=now, stabilizer=TranscriptStabilizer, echo_guard_ms=settings.echo_guard_ms,
            preempts=settings.voice_preemption, resumes_false_interruptions=settings.resume_false_interruptions, judges_server_vad=settings.server_vad_turn_model and runtime.turn_end is not None,
            can_speak=runtime.tts is not None and speech_factory is not None,
        )
        # WebRTC and GPT-Live: the outbound audio queue, which knows what the user has actually heard.
        self._playout: PlayoutBuffer | None = None
        self._inbox = Inbox(self.feed)
        # What the session learns carrying out a command (what was heard of a cleared reply): handled after the
        # batch, never from inside it (see feed).
        self._learned: deque[Input] = deque()
        self.response_driver: ResponseDriver | None = None  # from start(): its accounts are known then
        # The client's response.create, until the core commands its response (CreateResponse answers it): the
        # client's next event waits for that (push-to-talk: until what was just committed is transcribed).
        self._unanswered: tuple[ResponseRequested, asyncio.Future[None]] | None = None
        self._started = False
        self._started_at = time.monotonic()
        self.opened_at = self._started_at  # for --max-session-duration-s (session_limits.py)
        self.last_activity = self._started_at  # the last client event or response end: --session-idle-timeout-s
        self._closed = False
        self.voice: VoicePipeline | None = None
        self.recorder: ConversationRecorder | None = None  # attached to a stored conversation: attach_stored
        self.tokens: TokenAccount | None = None  # its key's token quota (SessionRegistry.open_session)
        # its key's memory, if the key turned it on (SessionRegistry.open_session)
        self.memory: MemoryAccount | None = None

    # -- what the core holds ---------------------------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        return self.core.config

    @property
    def conversation(self) -> Conversation:
        return self.core.conversation

    @property
    def active(self) -> ActiveResponse | None:
        return self.core.response

    @property
    def playout(self) -> PlayoutBuffer | None:
        return self._playout

    def attach_playout(self, playout: PlayoutBuffer) -> None:
        """Before start(), WebRTC: the reply's audio goes through this buffer, which knows what was heard."""
        self._playout = playout
        self.feed(PlayoutAttached())

    def start(self) -> None:
        self._started = True
        metrics.ACTIVE_SESSIONS.labels(self.transport).inc()
        self.runtime.heap.opened()
        feed = self._inbox.feed
        responses = ResponseDriver(
            feed, runtime=self.runtime, settings=self.settings,
            accounts=Accounts(self.runtime.safety, self.tokens, self.memory), speech=self.speech_factory,
            playout=self._playout, session_id=self.id, request_id=self.request_id)
        self.response_driver = responses
        if self.runtime.asr is not None:
            replies = ReplyAhead(self.runtime, self.settings, self.memory, responding=responses.running)
            self.voice = VoicePipeline(
                feed, responses.settle, runtime=self.runtime, settings=self.settings,
                head_start=HeadStart(replies, self.id), session_id=self.id, request_id=self.request_id,
                narrowband=self.transport in PHONE_TRANSPORTS)
        self.feed(SessionStarted(self.resume_token if self.settings.resume_window_s > 0 else None,
                                 listens=self.voice is not None))
        log_event("realtime.session.started", session_id=self.id, request_id=self.request_id, transport=self.transport,
                  model=self.config.model, conversation_id=self.conversation.id)

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self) -> None:
        """The transport is gone: stop the response quietly and release the conversation's cache."""
        if self._closed:
            return
        self._closed = True
        self._inbox.close()
        self._answer_request()
        if self._started:  # what start() counted
            metrics.ACTIVE_SESSIONS.labels(self.transport).dec()
            self.runtime.heap.closed()
            log_event("realtime.session.ended", session_id=self.id, request_id=self.request_id,
                      transport=self.transport, responses=self.response_driver.count if self.response_driver else 0,
                      duration_s=round(time.monotonic() - self._started_at, 3))
        self.outbox.close()
        if self.response_driver is not None:
            await self.response_driver.close()
        if self.voice is not None:
            await self.voice.close()
        if self.runtime.engine is not None:
            self.runtime.engine.end_conversation(self.conversation.id)
        if self.recorder is not None:
            await self.recorder.close()

    def send(self, event: Event, *, identified: bool = True) -> None:
        """`identified` False: an event whose type in the SDK has no event_id."""
        for wire_event in self._translate(event) if self._translate is not None else (event,):
            self.outbox.send(wire_event, identified=identified)
        if self.recorder is not None:
            self.recorder.observe(event, self.conversation)

    def attach_stored(self, conversation_id: str, items: list[Item], recorder: ConversationRecorder) -> None:
        """Before start(): continue a stored conversation (recorder.py). Its branch becomes the
        first items, announced after session.created, and what the session adds is stored."""
        conversation = Conversation(max_items=self.settings.max_conversation_items,
                                    max_bytes=self.settings.max_conversation_bytes, conversation_id=conversation_id)
        for item in items:
            conversation.add(item)  # conversation_full past the session's bounds
        self.feed(ConversationAttached(conversation))
        self.recorder = recorder

    def send_error(self, error: ApiError) -> None:
        metrics.ERRORS.labels("realtime", error.code).inc()
        log_event("realtime.error", session_id=self.id, request_id=self.request_id, code=error.code,
                  error_type=error.type, param=error.param, client_event_id=error.event_id)
        self.send(se.Error(error=error.body()).wire())

    # -- the core ---------------------------------------------------------------------------------

    def feed(self, event: Input) -> None:
        """Hand one input to the core and carry out what it returns, in order; then what the session learned
        doing so. A refused input raises ApiError (the core changed nothing): a client's event, or a response
        the response driver announces (ResponseStarted: it needs the answer before it starts the response's
        task, so a driver's input is handled at once). Inputs after close are dropped."""
        if self._closed:
            return
        try:
            outputs = self.core.handle(event)
        except IllegalInput as bug:  # a driver fed what the core's state cannot take: dropped, not fatal
            log.error("session %s: the realtime core refused an input: %s", self.id, bug)
            outputs = []
        for output in outputs:
            self._execute(output)
        while self._learned and not self._closed:
            self.feed(self._learned.popleft())

    def _execute(self, output: Output) -> None:
        match output:
            case Send():
                self.send(output.event)
            case SendError():
                self.send_error(output.error)
            case CreateResponse():
                assert self.response_driver is not None  # the core commands nothing before SessionStarted
                if self._unanswered is not None and output.answers is self._unanswered[0]:
                    self._answer_request()
                marks, preemption = TurnMarks(), None
                if output.turn is not None and self.voice is not None:
                    marks, preemption = self.voice.take_turn(output.turn)
                self.response_driver.create(output, marks, preemption)
            case StopResponse():
                assert self.response_driver is not None
                self.response_driver.stop(output)
            case ClearPlayout():
                if self.playout is not None:
                    self.playout.clear()
                    if output.measure_item_id is not None:
                        played = self.playout.played_ms(output.measure_item_id)
                        self._learned.append(PlayoutCleared(output.measure_item_id, played))
            case HoldPlayout():
                if self._playout is not None:
                    if output.held and self.voice is not None:
                        self.voice.partials_held = True
                    self._playout.hold(output.held)
            case PauseEnded():
                if self.voice is not None:
                    self.voice.partials_held = False
                metrics.PAUSED_REPLIES.labels(output.outcome).inc()
                metrics.REPLY_PAUSE_SECONDS.labels(output.outcome).observe(output.held_s)
            case SetProducing():
                if self.playout is not None:
                    self.playout.set_producing(output.producing)
            case ConfigureListening():
                assert self.voice is not None  # the core configures a session's listening only if it listens
                self.voice.listen(output.audio)
            case Transcribe():
                assert self.voice is not None  # only committed audio is transcribed
                self.voice.transcribe(output.item_id)
            case PrefillDraft():
                if self.voice is not None and output.context is not None:
                    self.voice.prefill_draft(output.context, output.text)
            case SetSilence():
                if self.voice is not None:
                    self.voice.set_silence(output.item_id, output.silence_ms)
            case StartSpeculation():
                if self.voice is not None:
                    self.voice.start_speculation(output.item_id, judge_end=output.judge_end,
                                                 preempt=output.context if output.preempt else None)
            case DiscardSpeculation():
                if self.voice is not None:
                    self.voice.discard_speculation(output.item_id)
            case DropTurn():
                if self.voice is not None:
                    self.voice.drop_turn(output.item_id)
            case ResponseFinished():
                assert self.response_driver is not None
                self.last_activity = time.monotonic()
                self.response_driver.finished(output)

    def _answer_request(self) -> None:
        """The client's response.create is answered (its response commanded), or the session closed: the client's
        next event may be handled."""
        if self._unanswered is not None:
            answered = self._unanswered[1]
            self._unanswered = None
            if not answered.done():
                answered.set_result(None)

    async def settle(self) -> None:
        """Wait until the responses being stopped have ended (their response.done is sent)."""
        if self.response_driver is not None:
            await self.response_driver.settle()

    # -- client events --------------------------------------------------------------------------

    async def receive(self, raw: str | bytes) -> None:
        """Handle one client message. Errors become `error` events; the session goes on."""
        try:
            event = decode_client_event(raw, max_bytes=self.settings.max_event_bytes)
        except ApiError as error:
            self.send_error(error)
            return
        metrics.CLIENT_EVENTS.labels(event.type).inc()
        self.last_activity = time.monotonic()
        try:
            await self._dispatch(event)
        except ApiError as error:
            error.event_id = event.event_id
            self.send_error(error)
        except SlowConsumer:
            raise
        except Exception:
            # A defect of ours, not the client's: say so and keep the session (its state changes are
            # made before the events that announce them, so nothing is left half done for the client).
            log.exception("session %s: handling %s failed", self.id, event.type)
            self.send_error(ApiError("server_error", f"The server failed to handle {event.type}.",
                                     type="server_error", status=500, event_id=event.event_id))

    async def _dispatch(self, event: ev.ClientEvent) -> None:
        match event:
            case ev.SessionUpdate():
                self._update_session(event.session)
            case ev.ConversationItemCreate():
                item = item_from_param(event.item)
                screen_item(self.runtime.safety, item)  # the policy, before the model sees it
                self.feed(ItemCreated(item, event.previous_item_id))
            case ev.ConversationItemRetrieve():
                self.feed(ItemRetrieve(event.item_id))
            case ev.ConversationItemDelete():
                self.feed(ItemDelete(event.item_id))
            case ev.ConversationItemTruncate():
                self.feed(ItemTruncate(event.item_id, event.content_index, event.audio_end_ms))
            case ev.ResponseCreate():
                request = ResponseRequested(event.response, event.event_id)
                answered = asyncio.get_running_loop().create_future()
                self._unanswered = (request, answered)
                try:
                    self.feed(request)
                except Exception:
                    self._answer_request()  # refused (an error event is its answer), or a defect
                    raise
                # Push-to-talk: the core answers it once what was just committed is transcribed; the client's next
                # event is handled after the response starts, as without the wait.
                await answered
            case ev.ResponseCancel():
                self.feed(CancelRequested(event.response_id))
                await self.settle()
            case _:
                await self._dispatch_audio(event)

    async def _dispatch_audio(self, event: ev.ClientEvent) -> None:
        if isinstance(event, ev.OutputAudioBufferClear):
            if self._playout is None:
                raise ApiError("invalid_value", "output_audio_buffer.clear is for WebRTC sessions and phone calls only.",
                               "type")
            self.feed(OutputClearRequested())
            await self.settle()
            return
        voice = self.voice
        if voice is None:
            raise ApiError("voice_unavailable", f"'{event.type}' needs the voice models, which are not loaded.", "type")
        if isinstance(event, ev.InputAudioBufferAppend):
            voice.append_encoded(event.audio)
        elif isinstance(event, ev.InputAudioBufferCommit):
            await voice.commit()
        elif isinstance(event, ev.InputAudioBufferClear):
            voice.clear()

    def _update_session(self, update: dict[str, Any]) -> None:
        model = update.get("model")
        if model is not None and model not in self.runtime.model_names:
            raise ApiError("model_not_found", f"Unknown model '{model}'. This server has '{self.settings.model_name}'.", "session.model", status=404)
        config = apply_session_update(self.config, update, speech=self.runtime.speech_options)
        self.feed(ConfigChanged(config))  # raises ApiError when the core refuses it

    # -- playout ------------------------------------------------------------------------------------

    def dtmf_received(self, digit: str, *, received_at: int) -> None:
        """A keypad digit the caller pressed (a phone call): said as Realtime says it, for the application."""
        if digit not in DTMF_DIGITS:
            raise ApiError("invalid_value", f"'{digit[:8]}' is not a keypad digit ({DTMF_DIGITS}).", "dtmf.digit")
        self.send(se.DtmfReceived(event=digit, received_at=received_at).wire(), identified=False)

    def on_playout_event(self, kind: str, item_id: str | None) -> None:
        """The WebRTC track (or a carrier's echo) started or finished playing a reply's audio (on the event loop)."""
        if kind == "started":
            self.feed(PlayoutStarted())
        elif kind == "stopped":
            self.feed(PlayoutStopped(item_id))
