"""One Realtime conversation's driver: it feeds what happens to its realtime core and carries out the core's
commands (the response task, the engine, the TTS, the playout, the outbox).

Transports (WebSocket, WebRTC data channel) feed raw client messages to `receive()` and drain `outbox`.
The turn and response state, and the events announcing its changes, come from `RealtimeCore`
(realtime_core.py) in one step each; this module owns the tasks: the response's, and the stoppers that
end a cancelled response after awaiting it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.generation.chat_plan import with_tools
from gateway.generation.memory import REMEMBER_TOOL, MemoryAccount
from gateway.generation.service import Generator
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.platform.latency import TurnMarks, now
from gateway.platform.runtime import Runtime
from gateway.platform.token_quota import TokenAccount
from gateway.protocol import client_events as ev
from gateway.protocol import server_events as se
from gateway.protocol.chat import MEMORY_TOOL_NAME
from gateway.protocol.codec import decode_client_event
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import (
    SessionConfig,
    ToolChoiceFunction,
    TurnDetection,
    apply_session_update,
    check_tool_choice,
)
from gateway.realtime.conversation import Conversation, Item, item_from_param, new_id, screen_item
from gateway.realtime.core import (
    ActiveResponse,
    CancelRequested,
    ClearPlayout,
    ConfigChanged,
    CreateResponse,
    DropTurn,
    FunctionCallsMade,
    Input,
    ItemCreated,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    MessageOpened,
    Output,
    OutputClearRequested,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    RealtimeCore,
    ResponseEnded,
    ResponseFiltered,
    ResponseFinished,
    ResponseRequested,
    ResponseStarted,
    Send,
    SendError,
    SessionStarted,
    SetProducing,
    StopResponse,
    TextDelta,
    Transcribe,
)
from gateway.realtime.outbox import Outbox, SlowConsumer
from gateway.realtime.preemption import Preemption
from gateway.realtime.response_events import Event, ResponseEvents, ResponseStatus, Usage
from gateway.realtime.responses import ResponseJob, ResponseRunner, SpeechStream, reply_spec
from gateway.realtime.store import ConversationRecorder
from gateway.realtime.voice import VoicePipeline
from gateway.safety.output import ContentFiltered
from inference.llm.backend import GenerationResult, SamplingParams
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolCall, ToolFormat, ToolSpec, ToolUse, plan_tool_use
from media.codecs import AudioFormatError, decode_input
from media.frames import AudioChunk
from media.playout import PlayoutBuffer
from media.resample import Resampler

log = logging.getLogger(__name__)

# How long a cancelled response task may take to unwind before the session stops waiting.
CANCEL_TIMEOUT_S = 2.0
USAGE_WAIT_S = 0.15  # how long a cancel waits for the engine's token counts before answering
INPUT_RATE = 16000  # what the VAD and Whisper take

TransportKind = Literal["websocket", "webrtc"]
SpeechFactory = Callable[["RealtimeSession", ResponseEvents, TurnMarks], SpeechStream]


@dataclass
class RunningResponse:
    """The driver's side of the core's response in progress: what runs it, and its latency marks."""

    events: ResponseEvents
    runner: ResponseRunner
    marks: TurnMarks
    task: asyncio.Task[None] | None = None


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
        session_id: str | None = None,  # the id its client secret announced when it was minted
    ) -> None:
        self.runtime = runtime
        self.request_id = request_id  # the handshake's (or call offer's) X-Request-ID, for the log
        self.settings = settings
        self.transport = transport
        self.speech_factory = speech_factory
        self.id = session_id or new_id("sess")
        self.outbox = Outbox(replay_bytes=settings.resume_buffer_bytes if settings.resume_window_s > 0 else 0)
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
            clock=now, echo_guard_ms=settings.echo_guard_ms,
            can_speak=runtime.tts is not None and speech_factory is not None,
        )
        # WebRTC only: the outbound audio queue, which knows what the user has actually heard.
        self._playout: PlayoutBuffer | None = None
        self._run: RunningResponse | None = None
        self._stoppers: set[asyncio.Task[None]] = set()  # each ends a cancelled response once its task is done
        self._fed = asyncio.Event()  # set after every input: a response.create waiting for transcripts checks
        self._started = False
        self._started_at = time.monotonic()
        self.opened_at = self._started_at  # for --max-session-duration-s (session_limits.py)
        self.last_activity = self._started_at  # the last client event or response end: --session-idle-timeout-s
        self._responses = 0
        self._closed = False
        self._input_resampler: tuple[str, Resampler] | None = None
        self.voice: VoicePipeline | None = None
        self.recorder: ConversationRecorder | None = None  # attached to a stored conversation: attach_stored
        self.tokens: TokenAccount | None = None  # its key's token quota (Services.open_session)
        self.memory: MemoryAccount | None = None  # its key's memory, if the key turned it on (Services.open_session)

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

    @playout.setter
    def playout(self, playout: PlayoutBuffer | None) -> None:
        self._playout = playout
        self.core.has_playout = playout is not None

    def start(self) -> None:
        self._started = True
        metrics.ACTIVE_SESSIONS.labels(self.transport).inc()
        self.runtime.heap.opened()
        if self.runtime.asr is not None:
            self.voice = VoicePipeline(self)
        self.feed(SessionStarted(self.resume_token if self.settings.resume_window_s > 0 else None))
        log_event("realtime.session.started", session_id=self.id, request_id=self.request_id, transport=self.transport,
                  model=self.config.model, conversation_id=self.conversation.id)

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self) -> None:
        """The transport is gone: stop the response quietly and release the conversation's cache."""
        if self._closed:
            return
        self._closed = True
        self._fed.set()
        if self._started:  # what start() counted
            metrics.ACTIVE_SESSIONS.labels(self.transport).dec()
            self.runtime.heap.closed()
            log_event("realtime.session.ended", session_id=self.id, request_id=self.request_id,
                      transport=self.transport, responses=self._responses,
                      duration_s=round(time.monotonic() - self._started_at, 3))
        self.outbox.close()
        if self._run is not None:
            await self._stop_task(self._run)
        if self._stoppers:
            await asyncio.wait(set(self._stoppers), timeout=CANCEL_TIMEOUT_S + USAGE_WAIT_S)
        # A finished task keeps its frame (and so this session) in its result or CancelledError: let them go.
        self._run = None
        self._stoppers.clear()
        if self.voice is not None:
            await self.voice.close()
            # The pipeline and the session refer to each other: without this, only the cycle
            # collector's full pass would free them (and the conversation), and in a process that
            # holds the models it practically never runs.
            self.voice = None
        if self.runtime.engine is not None:
            self.runtime.engine.end_conversation(self.conversation.id)
        if self.recorder is not None:
            await self.recorder.close()

    def send(self, event: Event) -> None:
        self.outbox.send(event)
        if self.recorder is not None:
            self.recorder.observe(event, self.conversation)

    def send_all(self, events: list[Event]) -> None:
        for event in events:
            self.send(event)

    def attach_stored(self, conversation_id: str, items: list[Item], recorder: ConversationRecorder) -> None:
        """Before start(): continue a stored conversation (realtime_store.py). Its branch becomes the
        first items, announced after session.created, and what the session adds is stored."""
        conversation = Conversation(max_items=self.settings.max_conversation_items,
                                    max_bytes=self.settings.max_conversation_bytes, conversation_id=conversation_id)
        for item in items:
            conversation.add(item)  # conversation_full past the session's bounds
        self.core.conversation = conversation
        self.recorder = recorder

    def send_error(self, error: ApiError) -> None:
        metrics.ERRORS.labels("realtime", error.code).inc()
        log_event("realtime.error", session_id=self.id, request_id=self.request_id, code=error.code,
                  error_type=error.type, param=error.param, client_event_id=error.event_id)
        self.send(se.Error(error=error.body()).wire())

    # -- the core ---------------------------------------------------------------------------------

    def feed(self, event: Input) -> None:
        """Hand one input to the core and carry out what it returns, in order. A refused client event
        raises ApiError (the core changed nothing). Inputs after close are dropped."""
        if self._closed:
            return
        try:
            for output in self.core.handle(event):
                self._execute(output)
        finally:
            self._fed.set()

    def _execute(self, output: Output) -> None:
        match output:
            case Send():
                self.send(output.event)
            case SendError():
                self.send_error(output.error)
            case CreateResponse():
                self._create_for(output)
            case StopResponse():
                self._stop(output)
            case ClearPlayout():
                if self.playout is not None:
                    self.playout.clear()
                    if output.measure_item_id is not None:
                        played = self.playout.played_ms(output.measure_item_id)
                        self.feed(PlayoutCleared(output.measure_item_id, played))
            case SetProducing():
                if self.playout is not None:
                    self.playout.set_producing(output.producing)
            case Transcribe():
                assert self.voice is not None  # only committed audio is transcribed
                self.voice.transcribe(output.item_id)
            case DropTurn():
                if self.voice is not None:
                    self.voice.drop_turn(output.item_id)
            case ResponseFinished():
                self._response_finished(output)

    async def settle(self) -> None:
        """Wait until the responses being stopped have ended (their response.done is sent)."""
        while self._stoppers:
            await asyncio.wait(set(self._stoppers))

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
                self.feed(ResponseRequested(event.response, event.event_id))
                # Push-to-talk: it waits for what was just committed to be transcribed; the client's next
                # event is handled after the response starts, as without the wait.
                while self.core.deferred_responses and not self._closed:
                    self._fed.clear()
                    await self._fed.wait()
            case ev.ResponseCancel():
                self.feed(CancelRequested(event.response_id))
                await self.settle()
            case _:
                await self._dispatch_audio(event)

    async def _dispatch_audio(self, event: ev.ClientEvent) -> None:
        if isinstance(event, ev.OutputAudioBufferClear):
            if self.transport != "webrtc":
                raise ApiError("invalid_value", "output_audio_buffer.clear is for WebRTC sessions only.", "type")
            self.feed(OutputClearRequested())
            await self.settle()
            return
        voice = self.voice
        if voice is None:
            raise ApiError("voice_unavailable", f"'{event.type}' needs the voice models, which are not loaded.", "type")
        if isinstance(event, ev.InputAudioBufferAppend):
            voice.append(self._decode_input_audio(event.audio))
        elif isinstance(event, ev.InputAudioBufferCommit):
            await voice.commit()
        elif isinstance(event, ev.InputAudioBufferClear):
            voice.clear()

    def _decode_input_audio(self, audio_b64: str) -> AudioChunk:
        """base64 in the session's input format -> 16 kHz mono, resampled with a per-stream resampler."""
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("invalid_audio", "'audio' is not valid base64.", "audio") from None
        fmt = self.config.audio.input.format.type
        try:
            chunk = decode_input(fmt, data)
        except AudioFormatError as exc:
            raise ApiError("invalid_audio", f"Audio does not match the session's format {fmt}: {exc}.", "audio") from None
        if chunk.sample_rate == INPUT_RATE:
            return chunk
        if self._input_resampler is None or self._input_resampler[0] != fmt:
            self._input_resampler = (fmt, Resampler(chunk.sample_rate, INPUT_RATE))
        return AudioChunk(self._input_resampler[1].process(chunk.pcm), INPUT_RATE)

    def _update_session(self, update: dict[str, Any]) -> None:
        model = update.get("model")
        if model is not None and model not in self.runtime.model_names:
            raise ApiError("model_not_found", f"Unknown model '{model}'. This server has '{self.settings.model_name}'.", "session.model", status=404)
        self.feed(ConfigChanged(apply_session_update(self.config, update, speech=self.runtime.speech_options)))
        if self.voice is not None:
            self.voice.config_changed()

    def speaks_by_default(self) -> bool:
        """Whether a response created with no parameters has audio."""
        return "audio" in self.config.output_modalities and self.core.can_speak

    def screened(self, text: str) -> str | None:
        """A user's words as the model may read them ahead of their turn (a speculative transcript): redacted,
        or None when the policy refuses them."""
        if not self.runtime.safety:
            return text
        screened = self.runtime.safety.screen(text)
        return None if screened.blocked is not None else screened.text

    # -- responses ------------------------------------------------------------------------------

    def _tool_use(self, params: ev.ResponseParams, fmt: ToolFormat) -> ToolUse:
        """The reply's tools: the client's (the response's own, or the session's)."""
        return self._tools_planner(params, fmt)([])

    def _tools_planner(self, params: ev.ResponseParams, fmt: ToolFormat) -> Callable[[list[ToolSpec]], ToolUse]:
        """Plans the reply's tools, as they are now, with the built-in ones given (memory's `remember`). A choice
        that names a built-in tool not given plans as "auto" (the response refuses it: see ResponseRunner)."""
        tools = params.tools if params.tools is not None else self.config.tools
        choice = params.tool_choice or self.config.tool_choice
        try:
            check_tool_choice(tools, choice)
        except ValueError as exc:
            raise ApiError("invalid_value", str(exc), "response.tool_choice") from None
        specs = [ToolSpec(tool.name, tool.description, tool.parameters) for tool in tools]

        def plan(builtin: list[ToolSpec]) -> ToolUse:
            if isinstance(choice, ToolChoiceFunction):
                if choice.name in {tool.name for tool in [*specs, *builtin]}:
                    return plan_tool_use(specs, choice="function", name=choice.name, fmt=fmt, builtin=builtin)
                return plan_tool_use(specs, choice="auto", fmt=fmt, builtin=builtin)
            return plan_tool_use(specs, choice=choice, fmt=fmt, builtin=builtin)

        return plan

    def _names_memory_tool(self, params: ev.ResponseParams) -> bool:
        tools = params.tools if params.tools is not None else self.config.tools
        choice = params.tool_choice or self.config.tool_choice
        return (isinstance(choice, ToolChoiceFunction) and choice.name == MEMORY_TOOL_NAME
                and all(tool.name != MEMORY_TOOL_NAME for tool in tools))

    def _reply_sampling(self, params: ev.ResponseParams, context_window: int) -> SamplingParams:
        max_tokens = params.max_output_tokens or self.config.max_output_tokens
        if max_tokens == "inf":
            max_tokens = context_window // 2
        return SamplingParams(
            temperature=next(t for t in (params.temperature, self.config.temperature, self.settings.realtime_temperature)
                             if t is not None),
            max_tokens=int(max_tokens),
            repetition_penalty=self.settings.repetition_penalty,
        )


    async def preempt_reply(self, user_item_id: str, user_text: str) -> Preemption | None:
        """Start generating the default reply to a user turn that may not be committed yet.

        The voice path calls this with the speculative final transcript while the VAD waits out the
        silence; the turn's response adopts the stream when its prompt turns out the same. The
        turn's item, when already added, is replaced by `user_text` at the end. None when no reply
        can start now (a response is running, no model, the engine is full).
        """
        engine = self.runtime.engine
        if engine is None or self.active is not None:
            return None
        params = ev.ResponseParams()
        if self._tool_use(params, engine.lm.tool_format).tools:
            return None  # a reply that may call functions has their instructions and maybe a grammar
        words = self.screened(user_text)
        if words is None:
            return None  # refused: the turn's final transcript will say so
        history = self.conversation.chat_messages(self.config.instructions, excluding=user_item_id)
        messages = [*history, ChatMessage("user", words)]
        sampling = self._reply_sampling(params, engine.lm.context_window)
        extra, tools = await self.memory_messages(messages, engine.lm.tool_format)
        runtime = self.runtime
        generator = Generator(engine, runtime.safety, runtime.classifier, self.settings.safety_classifier_timeout_s)
        try:
            # No tokens reserved: the response that adopts it reserves them.
            prepared = await generator.prepare(reply_spec([*messages, *extra], tools), sampling)
            if self.active is not None:
                return None
            reply = await generator.start(prepared, conversation_id=self.conversation.id)
        except ApiError:
            return None  # the response itself will meet (and report) the same condition
        return Preemption(prompt_ids=prepared.prompt_ids, sampling=sampling, stream=reply, started_at=now())

    async def memory_messages(self, messages: list[ChatMessage], fmt: ToolFormat) -> tuple[list[ChatMessage], ToolUse]:
        """What a default response to `messages` adds with the key's memory on, so that a reply or prefill made
        ahead has its prompt: the memories that bear on the last user message (nothing is saved from it, it may
        be a draft) and the memory tool, as system messages, and the tool's use."""
        remembered = await self.memory.recall(messages, save=False) if self.memory is not None else None
        if remembered is None:
            return [], ToolUse([])
        tools = self._tools_planner(ev.ResponseParams(), fmt)([REMEMBER_TOOL])
        return [*with_tools([], tools), *remembered.messages()], tools

    def _create_for(self, command: CreateResponse) -> None:
        """The core's CreateResponse: a client's response.create, a user turn's reply, or the idle nudge."""
        marks, preemption = TurnMarks(), None
        if command.turn is not None and self.voice is not None:
            marks, preemption = self.voice.take_turn(command.turn)
        try:
            self.create_response(command.params, marks=marks, preemption=preemption)
        except ApiError as error:
            if preemption is not None:
                preemption.cancel()
            error.event_id = command.event_id
            self.send_error(error)

    def create_response(
        self, params: ev.ResponseParams, *, marks: TurnMarks | None = None, preemption: Preemption | None = None
    ) -> None:
        """Start a response now (synchronously), or raise if one is already running.

        ``preemption``: a generation already started for this reply (see preempt_reply); the
        response takes it over when its prompt is the same, and cancels it otherwise.
        """
        self.core.ensure_no_response()
        engine = self.runtime.engine
        if engine is None:
            raise ApiError("model_not_ready", "The model is still loading.", type="server_error", status=503)
        modalities = params.output_modalities or self.config.output_modalities
        audio = "audio" in modalities
        if audio and not self.core.can_speak:
            raise ApiError("invalid_value", "Audio output is not available in this session.", "response.output_modalities")
        instructions = params.instructions if params.instructions is not None else self.config.instructions
        plan_tools = self._tools_planner(params, engine.lm.tool_format)  # the tools as they are now
        tool_use = plan_tools([])
        if params.conversation not in ("auto", "none", self.conversation.id):
            raise ApiError("invalid_value", f"Unknown conversation '{params.conversation}': 'auto', 'none' or this "
                           f"session's '{self.conversation.id}'.", "response.conversation")
        writes_conversation = params.conversation != "none"
        context = self.conversation
        if params.input is not None:
            context = Conversation(max_items=self.settings.max_conversation_items,
                                   max_bytes=self.settings.max_conversation_bytes)
            for param in params.input:
                item = item_from_param(param)
                screen_item(self.runtime.safety, item)
                context.add(item)
        if not len(context):
            raise ApiError("empty_conversation", "There is nothing to respond to: add a message first.")
        messages = context.chat_messages(instructions)  # the runner adds what the tools need
        marks = marks or TurnMarks()
        marks.mark("response_created")
        item = Item(id=new_id("item"), type="message", role="assistant", status="in_progress")
        output_format = self.config.audio.output.format
        events = ResponseEvents(
            response_id=new_id("resp"),
            conversation_id=self.conversation.id if writes_conversation else None,
            item=item,
            audio=audio,
            audio_format=output_format.model_dump(),
            voice=self.config.audio.output.voice,
            max_output_tokens=params.max_output_tokens or self.config.max_output_tokens,
            metadata=dict(params.metadata) if params.metadata else None,
        )
        job = ResponseJob(
            messages=messages,
            sampling=self._reply_sampling(params, engine.lm.context_window),
            conversation_key=self.conversation.id if writes_conversation else None,
            marks=marks,
            preemption=preemption,
            speech_speed=self.config.audio.output.speed,
            tool_use=tool_use,
            plan_tools=plan_tools,
            names_memory_tool=self._names_memory_tool(params),
            safety=self.runtime.safety,
            tokens=self.tokens,
            memory=self.memory,
            classifier=self.runtime.classifier,
            classifier_timeout_s=self.settings.safety_classifier_timeout_s,
        )
        speech = self.speech_factory(self, events, marks) if audio and self.speech_factory is not None else None
        response_id = events.response_id

        def add_calls(calls: list[ToolCall]) -> None:
            self.feed(FunctionCallsMade(response_id, calls))

        runner = ResponseRunner(engine=engine, tts=self.runtime.tts, job=job, events=events, send=self.send_all,
                                speech=speech, open_message=lambda: self.feed(MessageOpened(response_id)),
                                add_calls=add_calls, text_delta=lambda text: self.feed(TextDelta(response_id, text)))
        # With tools, the message opens with its first text: the reply may be calls.
        self.feed(ResponseStarted(events, writes_conversation, open_message=not tool_use.tools))
        run = RunningResponse(events=events, runner=runner, marks=marks)
        self._run = run
        run.task = asyncio.create_task(self._run_response(run), name=f"response {response_id}")

    async def _run_response(self, run: RunningResponse) -> None:
        # A cancelled run sends nothing more: whoever cancelled it ends the response (see _stop_run).
        try:
            result = await run.runner.run()
        except ContentFiltered:
            # Its generation is stopped: the audio not yet played is cleared, as in a barge-in, the item keeps
            # what was sent (heard, over WebRTC), and the response ends incomplete.
            self.feed(ResponseFiltered(run.events.response_id))
            self._end(run, "incomplete", reason="content_filter", result=await self._final_result(run))
        except ApiError as exc:  # the generation service maps the backend's errors
            self._end(run, "failed", error=exc)
        except Exception as exc:
            log.exception("response %s failed", run.events.response_id)
            error = ApiError("internal_error", f"The response failed: {exc}", type="server_error", status=500)
            self._end(run, "failed", error=error)
        else:
            status: ResponseStatus = "incomplete" if result.finish_reason == "length" else "completed"
            self._end(run, status, reason="max_output_tokens" if status == "incomplete" else None, result=result)

    def _end(self, run: RunningResponse, status: ResponseStatus, *, reason: str | None = None,
             result: GenerationResult | None = None, error: ApiError | None = None) -> None:
        run.marks.mark("done")
        usage = None
        if result is not None:
            usage = Usage(result.prompt_tokens, result.cached_prompt_tokens, result.completion_tokens)
            if result.admitted_at is not None:
                metrics.QUEUE_WAIT_SECONDS.labels("realtime").observe(result.admitted_at - result.submitted_at)
        item_id = run.events.item.id
        heard_ms = self.playout.played_ms(item_id) if self.playout is not None else None
        self.feed(ResponseEnded(run.events.response_id, status, run.marks.to_wire(), reason=reason, usage=usage,
                                error=error, heard_ms=heard_ms))

    def _response_finished(self, done: ResponseFinished) -> None:
        run = self._run
        if run is None or run.events is not done.events:
            return
        self._run = None
        self.last_activity = time.monotonic()
        metrics.RESPONSES.labels(done.status).inc()
        self._log_response(run, done.status, done.reason, done.usage, done.error)
        for stage, seconds in run.marks.stage_durations().items():
            metrics.STAGE_SECONDS.labels(stage).observe(seconds)

    def _log_response(self, run: RunningResponse, status: ResponseStatus, reason: str | None, usage: Usage | None,
                      error: dict[str, Any] | None) -> None:
        """One record per response: ids, status, token counts and latency marks (the answer only with
        --log-content). With session.tracing, the trace's names and metadata go with it."""
        tracing = self.config.tracing
        named = tracing if tracing is not None and not isinstance(tracing, str) else None
        events = run.events
        text = events.item.content[0].get("transcript" if events.audio else "text") if events.opened else None
        self._responses += 1
        log_event(
            "realtime.response.done", session_id=self.id, request_id=self.request_id, response_id=events.response_id,
            conversation_id=events.conversation_id, model=self.config.model, status=status, reason=reason,
            error_code=error.get("code") if error else None,
            input_tokens=usage.input_tokens if usage else None, cached_tokens=usage.cached_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None, modality="audio" if events.audio else "text",
            latency_ms=run.marks.to_wire(),
            trace={"workflow_name": (named and named.workflow_name) or "Realtime Session",
                   "group_id": named and named.group_id, "metadata": named and named.metadata} if tracing else None,
            content={"output_text": text} if text is not None else None,
        )

    def _stop(self, command: StopResponse) -> None:
        run = self._run
        if run is None or run.events.response_id != command.response_id:
            return
        stopper = asyncio.create_task(self._stop_run(run, command), name=f"stop {command.response_id}")
        self._stoppers.add(stopper)
        stopper.add_done_callback(self._stoppers.discard)

    async def _stop_run(self, run: RunningResponse, command: StopResponse) -> None:
        """Stop the response at once and end it with status `cancelled`.

        Order matters: generation is told to stop (next engine step), the task is cancelled and
        awaited, then this owner (never the cancelled task) feeds the end, whose tail events the core sends.
        """
        started = time.perf_counter()
        await self._stop_task(run)
        run.runner.release_held()
        self._end(run, "cancelled", reason=command.reason, result=await self._final_result(run))
        if command.barge_in:
            metrics.BARGE_IN_SECONDS.observe(time.perf_counter() - started)

    def on_playout_event(self, kind: str, item_id: str | None) -> None:
        """The WebRTC track started or finished playing a reply's audio (called on the event loop)."""
        if kind == "started":
            self.feed(PlayoutStarted())
        elif kind == "stopped":
            self.feed(PlayoutStopped(item_id))

    async def _stop_task(self, run: RunningResponse) -> None:
        run.runner.cancel_generation()
        if run.task is not None and not run.task.done():
            run.task.cancel()
            await asyncio.wait({run.task}, timeout=CANCEL_TIMEOUT_S)

    async def _final_result(self, run: RunningResponse) -> GenerationResult | None:
        """The cancelled generation's usage; the engine stops within a step, and we wait no longer."""
        if run.runner.stream is None:
            return None
        try:
            return await asyncio.wait_for(run.runner.stream.result(), timeout=USAGE_WAIT_S)
        except Exception:  # usage is best effort for a cancelled response
            return None
