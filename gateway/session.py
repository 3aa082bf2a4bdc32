"""One Realtime conversation: it owns its items, its response task and its voice pipeline.

Transports (WebSocket, WebRTC data channel) feed raw client messages to `receive()` and drain
`outbox`. Every state change and the events announcing it happen without an await in between.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway import metrics
from gateway.chat_plan import with_tools
from gateway.config import Settings
from gateway.conversation import Conversation, Item, item_from_param, new_id
from gateway.event_log import log_event
from gateway.latency import TurnMarks, now
from gateway.llm_errors import BACKEND_ERRORS, backend_api_error
from gateway.memory import REMEMBER_TOOL, MemoryAccount
from gateway.outbox import Outbox, SlowConsumer
from gateway.preemption import Preemption
from gateway.protocol import client_events as ev
from gateway.protocol.chat import MEMORY_TOOL_NAME
from gateway.protocol.codec import decode_client_event
from gateway.protocol.errors import ApiError
from gateway.protocol.response_events import Event, ResponseEvents, ResponseStatus, Usage
from gateway.protocol.session_config import (
    SessionConfig,
    ToolChoiceFunction,
    TurnDetection,
    apply_session_update,
    check_tool_choice,
)
from gateway.realtime_store import ConversationRecorder
from gateway.responses import ResponseJob, ResponseRunner, SpeechStream, render_reply_prompt
from gateway.runtime import Runtime
from gateway.safety.output import ContentFiltered
from gateway.safety.screening import screen_item
from gateway.token_quota import TokenAccount
from gateway.turns import TurnMachine, TurnPolicy
from gateway.voice import VoicePipeline
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
class ActiveResponse:
    events: ResponseEvents
    runner: ResponseRunner
    marks: TurnMarks
    task: asyncio.Task[None] | None = None
    cancelling: bool = False


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
        self.conversation = Conversation(max_items=settings.max_conversation_items,
                                         max_bytes=settings.max_conversation_bytes)
        self.active: ActiveResponse | None = None
        self.pending_marks: TurnMarks | None = None  # set by the voice path for the next response
        # WebRTC only: the outbound audio queue, which knows what the user has actually heard.
        self.playout: PlayoutBuffer | None = None
        self._speaking_item: Item | None = None  # assistant item whose audio is still playing out
        self._speaking_response_id: str | None = None
        self.turns = TurnMachine()
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
        self.config = apply_session_update(config, initial_config, speech=speech) if initial_config else config
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
        self._stored_items: list[Item] = []

    def start(self) -> None:
        self._started = True
        metrics.ACTIVE_SESSIONS.labels(self.transport).inc()
        self.runtime.heap.opened()
        if self.runtime.asr is not None:
            self.voice = VoicePipeline(self)
        self.on_config_changed()
        created: Event = {"type": "session.created", "session": self.config.to_wire()}
        if self.settings.resume_window_s > 0:
            created["resume_token"] = self.resume_token
        self.send(created)
        previous = None
        for item in self._stored_items:
            self.send({"type": "conversation.item.added", "previous_item_id": previous, "item": item.to_wire()})
            self.send({"type": "conversation.item.done", "previous_item_id": previous, "item": item.to_wire()})
            previous = item.id
        log_event("realtime.session.started", session_id=self.id, request_id=self.request_id, transport=self.transport,
                  model=self.config.model, conversation_id=self.conversation.id)

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self) -> None:
        """The transport is gone: stop the response quietly and release the conversation's cache."""
        if self._closed:
            return
        self._closed = True
        if self._started:  # what start() counted
            metrics.ACTIVE_SESSIONS.labels(self.transport).dec()
            self.runtime.heap.closed()
            log_event("realtime.session.ended", session_id=self.id, request_id=self.request_id,
                      transport=self.transport, responses=self._responses,
                      duration_s=round(time.monotonic() - self._started_at, 3))
        self.outbox.close()
        if self.active is not None:
            await self._stop_active(self.active)
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
        self.conversation = Conversation(max_items=self.settings.max_conversation_items,
                                         max_bytes=self.settings.max_conversation_bytes, conversation_id=conversation_id)
        for item in items:
            self.conversation.add(item)  # conversation_full past the session's bounds
        self._stored_items = items
        self.recorder = recorder

    def send_error(self, error: ApiError) -> None:
        metrics.ERRORS.labels("realtime", error.code).inc()
        log_event("realtime.error", session_id=self.id, request_id=self.request_id, code=error.code,
                  error_type=error.type, param=error.param, client_event_id=error.event_id)
        self.send({"type": "error", "error": error.body()})

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
                self._create_item(event)
            case ev.ConversationItemRetrieve():
                item = self.conversation.get(event.item_id)
                self.send({"type": "conversation.item.retrieved", "item": item.to_wire()})
            case ev.ConversationItemDelete():
                self._delete_item(event.item_id)
            case ev.ConversationItemTruncate():
                self._truncate_item(event)
            case ev.ResponseCreate():
                if self.config.transcribes_only:
                    raise ApiError("invalid_value", "A transcription session creates no responses.", "type")
                if self.voice is not None:
                    await self.voice.transcripts_done()
                self.create_response(event.response)
            case ev.ResponseCancel():
                await self._cancel_from_client(event.response_id)
            case _:
                await self._dispatch_audio(event)

    async def _dispatch_audio(self, event: ev.ClientEvent) -> None:
        if isinstance(event, ev.OutputAudioBufferClear):
            if self.transport != "webrtc":
                raise ApiError("invalid_value", "output_audio_buffer.clear is for WebRTC sessions only.", "type")
            await self.interrupt("client_cancelled")
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
        config = apply_session_update(self.config, update, speech=self.runtime.speech_options)
        if config.type != self.config.type and (len(self.conversation) or self.active is not None):
            raise ApiError("invalid_value", f"A {self.config.type} session becomes a {config.type} one only before its "
                           "first item.", "session.type")
        if config.wants_audio() and not config.transcribes_only and not self._can_speak():
            raise ApiError(
                "invalid_value",
                "Audio output needs the voice models (start without --no-load-voice-models).",
                "session.output_modalities",
            )
        self.config = config
        self.on_config_changed()
        self.send({"type": "session.updated", "session": self.config.to_wire()})

    def on_config_changed(self) -> None:
        detection = self.config.audio.input.turn_detection
        self.turns.policy = TurnPolicy(
            create_response=detection.create_response if detection else False,
            interrupt_response=detection.interrupt_response if detection else False,
            echo_guard_ms=self.settings.echo_guard_ms,
        )
        if self.voice is not None:
            self.voice.config_changed()

    def speaks_by_default(self) -> bool:
        """Whether a response created with no parameters has audio."""
        return "audio" in self.config.output_modalities and self._can_speak()

    def _can_speak(self) -> bool:
        return self.runtime.tts is not None and self.speech_factory is not None

    def _create_item(self, event: ev.ConversationItemCreate) -> None:
        item = item_from_param(event.item)
        screen_item(self.runtime.safety, item)  # the policy, before the model sees it
        self.add_item(item, event.previous_item_id)

    def screened(self, text: str) -> str | None:
        """A user's words as the model may read them ahead of their turn (a speculative transcript): redacted,
        or None when the policy refuses them."""
        if not self.runtime.safety:
            return text
        screened = self.runtime.safety.screen(text)
        return None if screened.blocked is not None else screened.text

    def add_item(self, item: Item, previous_item_id: str | None = None) -> None:
        previous = self.conversation.add(item, previous_item_id)
        self.send({"type": "conversation.item.added", "previous_item_id": previous, "item": item.to_wire()})
        self.send({"type": "conversation.item.done", "previous_item_id": previous, "item": item.to_wire()})

    def _delete_item(self, item_id: str) -> None:
        if self.active is not None and self.active.events.item.id == item_id:
            raise ApiError("item_in_use", "The item belongs to the response in progress; cancel it first.", "item_id")
        self.conversation.delete(item_id)
        self.send({"type": "conversation.item.deleted", "item_id": item_id})

    def _truncate_item(self, event: ev.ConversationItemTruncate) -> None:
        item = self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        self.send(
            {
                "type": "conversation.item.truncated",
                "item_id": item.id,
                "content_index": event.content_index,
                "audio_end_ms": round(item.audio_ms_sent),
            }
        )

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
        try:
            prompt = await asyncio.to_thread(render_reply_prompt, engine.lm, [*messages, *extra], sampling, tools)
            if self.active is not None:
                return None
            stream = engine.submit(prompt.token_ids, sampling, conversation_id=self.conversation.id,
                                   messages=prompt.messages)
        except (ApiError, *BACKEND_ERRORS):
            return None  # the response itself will meet (and report) the same condition
        return Preemption(prompt_ids=prompt.token_ids, sampling=sampling, stream=stream, started_at=now())

    async def memory_messages(self, messages: list[ChatMessage], fmt: ToolFormat) -> tuple[list[ChatMessage], ToolUse]:
        """What a default response to `messages` adds with the key's memory on, so that a reply or prefill made
        ahead has its prompt: the memories that bear on the last user message (nothing is saved from it, it may
        be a draft) and the memory tool, as system messages, and the tool's use."""
        remembered = await self.memory.recall(messages, save=False) if self.memory is not None else None
        if remembered is None:
            return [], ToolUse([])
        tools = self._tools_planner(ev.ResponseParams(), fmt)([REMEMBER_TOOL])
        return [*with_tools([], tools), *remembered.messages()], tools

    def create_response(self, params: ev.ResponseParams, *, preemption: Preemption | None = None) -> None:
        """Start a response now (synchronously), or raise if one is already running.

        ``preemption``: a generation already started for this reply (see preempt_reply); the
        response takes it over when its prompt is the same, and cancels it otherwise.
        """
        if self.active is not None:
            raise ApiError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.active.events.response_id}. "
                "Wait until the response is finished before creating a new one.",
            )
        engine = self.runtime.engine
        if engine is None:
            raise ApiError("model_not_ready", "The model is still loading.", type="server_error", status=503)
        modalities = params.output_modalities or self.config.output_modalities
        audio = "audio" in modalities
        if audio and not self._can_speak():
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
        marks = self.pending_marks or TurnMarks()
        self.pending_marks = None
        marks.mark("response_created")
        if audio:
            self.interrupt_playout()  # a new reply replaces whatever is still playing
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

        def open_message() -> None:
            previous = self.conversation.add(item) if writes_conversation else None
            self.send_all(events.open_item(previous))

        def add_calls(calls: list[ToolCall]) -> None:
            for call in calls:
                call_item = Item(id=new_id("item"), type="function_call", call_id=call.id, name=call.name,
                                 arguments=call.arguments)
                previous = self.conversation.add(call_item) if writes_conversation else None
                self.send_all(events.function_call(call_item, previous))

        runner = ResponseRunner(engine=engine, tts=self.runtime.tts, job=job, events=events, send=self.send_all,
                                speech=speech, open_message=open_message, add_calls=add_calls)
        active = ActiveResponse(events=events, runner=runner, marks=marks)
        self.active = active
        self.turns.response_started()
        if audio and self.playout is not None:
            self.playout.set_producing(True)
            self._speaking_item, self._speaking_response_id = item, events.response_id
        self.send_all(events.created())
        if not tool_use.tools:  # with tools, the message opens with its first text: the reply may be calls
            open_message()
        active.task = asyncio.create_task(self._run_response(active), name=f"response {events.response_id}")

    async def _run_response(self, active: ActiveResponse) -> None:
        # A cancelled run sends nothing more: whoever cancelled it ends the response (see cancel_response).
        try:
            result = await active.runner.run()
        except ContentFiltered:
            await self._stop_filtered(active)
        except (ApiError, *BACKEND_ERRORS) as exc:
            error = exc if isinstance(exc, ApiError) else backend_api_error(exc)
            self.send_error(error)
            self._finish(active, "failed", error=error.body())
        except Exception as exc:
            log.exception("response %s failed", active.events.response_id)
            error = ApiError("internal_error", f"The response failed: {exc}", type="server_error", status=500)
            self.send_error(error)
            self._finish(active, "failed", error=error.body())
        else:
            status: ResponseStatus = "incomplete" if result.finish_reason == "length" else "completed"
            self._finish(active, status, reason="max_output_tokens" if status == "incomplete" else None, result=result)

    def _finish(
        self,
        active: ActiveResponse,
        status: ResponseStatus,
        *,
        reason: str | None = None,
        result: GenerationResult | None = None,
        error: dict[str, Any] | None = None,
        final_text: str | None = None,
    ) -> None:
        if self.active is not active:
            return
        self.active = None
        self.last_activity = time.monotonic()
        active.marks.mark("done")
        usage = None
        if result is not None:
            usage = Usage(result.prompt_tokens, result.cached_prompt_tokens, result.completion_tokens)
            if result.admitted_at is not None:
                metrics.QUEUE_WAIT_SECONDS.labels("realtime").observe(result.admitted_at - result.submitted_at)
        metadata = dict(active.events.metadata or {})
        # Metadata maps strings to strings (the SDK's type): the marks travel as one compact JSON string.
        metadata["gateway_latency"] = json.dumps(active.marks.to_wire(), separators=(",", ":"))
        active.events.metadata = metadata
        self.send_all(active.events.finish(status, reason=reason, usage=usage, error=error, final_text=final_text))
        if self.playout is not None:
            self.playout.set_producing(False)
        if not self.playout_busy():
            self._reply_finished()
        metrics.RESPONSES.labels(status).inc()
        self._log_response(active, status, reason, usage, error)
        for stage, seconds in active.marks.stage_durations().items():
            metrics.STAGE_SECONDS.labels(stage).observe(seconds)

    def _log_response(self, active: ActiveResponse, status: ResponseStatus, reason: str | None, usage: Usage | None,
                      error: dict[str, Any] | None) -> None:
        """One record per response: ids, status, token counts and latency marks (the answer only with
        --log-content). With session.tracing, the trace's names and metadata go with it."""
        tracing = self.config.tracing
        named = tracing if tracing is not None and not isinstance(tracing, str) else None
        events = active.events
        text = events.item.content[0].get("transcript" if events.audio else "text") if events.opened else None
        self._responses += 1
        log_event(
            "realtime.response.done", session_id=self.id, request_id=self.request_id, response_id=events.response_id,
            conversation_id=events.conversation_id, model=self.config.model, status=status, reason=reason,
            error_code=error.get("code") if error else None,
            input_tokens=usage.input_tokens if usage else None, cached_tokens=usage.cached_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None, modality="audio" if events.audio else "text",
            latency_ms=active.marks.to_wire(),
            trace={"workflow_name": (named and named.workflow_name) or "Realtime Session",
                   "group_id": named and named.group_id, "metadata": named and named.metadata} if tracing else None,
            content={"output_text": text} if text is not None else None,
        )

    async def _stop_filtered(self, active: ActiveResponse) -> None:
        """The reply matched a block rule (its generation is stopped): the audio not yet played is cleared, as in
        a barge-in, the item keeps what was sent (heard, over WebRTC), and the response ends incomplete."""
        final_text = None
        if active.events.audio:
            self.interrupt_playout()
            item = active.events.item
            final_text = item.cut_audio(self.playout.played_ms(item.id) if self.playout is not None else item.audio_ms_sent)
        self._finish(active, "incomplete", reason="content_filter", result=await self._final_result(active),
                     final_text=final_text)

    async def _cancel_from_client(self, response_id: str | None) -> None:
        active = self.active
        if active is None or (response_id is not None and response_id != active.events.response_id):
            raise ApiError("response_cancel_not_active", "There is no active response to cancel.")
        await self.cancel_response("client_cancelled")

    async def cancel_response(self, reason: str) -> None:
        """Stop the active response at once and end it with status `cancelled`.

        Order matters: generation is told to stop (next engine step), the task is cancelled and
        awaited, then the owner (this coroutine, never the cancelled task) sends the tail events.
        """
        active = self.active
        if active is None or active.cancelling:
            return
        active.cancelling = True
        await self._stop_active(active)
        active.runner.release_held()
        result = await self._final_result(active)
        final_text = None
        if active.events.audio:
            # Trim the interrupted reply to the audio the user got: played (WebRTC) or sent (WebSocket).
            item = active.events.item
            final_text = item.cut_audio(self.playout.played_ms(item.id) if self.playout is not None else item.audio_ms_sent)
        self._finish(active, "cancelled", reason=reason, result=result, final_text=final_text)

    # -- interruption and playout ------------------------------------------------------------------

    async def interrupt(self, reason: str) -> None:
        """Barge-in: silence the audio first (within one frame), then cancel and trim the reply."""
        started = time.perf_counter()
        self.interrupt_playout()
        if self.active is not None:
            await self.cancel_response(reason)
            metrics.BARGE_IN_SECONDS.observe(time.perf_counter() - started)
        self._reply_finished()

    def interrupt_playout(self) -> None:
        """Drop queued WebRTC audio; an item that had finished generating is cut to what was heard."""
        if self.playout is None:
            return
        self.playout.clear()
        item, response_id = self._speaking_item, self._speaking_response_id
        self._speaking_item = self._speaking_response_id = None
        if item is None:
            return
        self.send({"type": "output_audio_buffer.cleared", "response_id": response_id})
        if self.active is None or self.active.events.item is not item:
            # The reply was complete but not yet all heard: trim it now.
            heard = item.cut_audio(self.playout.played_ms(item.id))
            if item.content:
                item.content[0]["transcript"] = heard
            item.status = "incomplete"
            self.send(
                {"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0, "audio_end_ms": round(item.audio_ms_sent)}
            )

    def playout_busy(self) -> bool:
        return self.playout is not None and self._speaking_item is not None

    def on_playout_event(self, kind: str, item_id: str | None) -> None:
        """The WebRTC track started or finished playing a reply's audio (called on the event loop)."""
        response_id = self._speaking_response_id
        if kind == "started":
            self.turns.playback_started(now() * 1000)
            self.send({"type": "output_audio_buffer.started", "response_id": response_id})
        elif kind == "stopped" and self._speaking_item is not None and self._speaking_item.id == item_id:
            self._speaking_item = self._speaking_response_id = None
            self.send({"type": "output_audio_buffer.stopped", "response_id": response_id})
            if self.active is None:
                self._reply_finished()

    def _reply_finished(self) -> None:
        self.turns.reply_finished()
        if self.voice is not None:
            self.voice.reply_finished()

    async def _stop_active(self, active: ActiveResponse) -> None:
        active.runner.cancel_generation()
        if active.task is not None and not active.task.done():
            active.task.cancel()
            await asyncio.wait({active.task}, timeout=CANCEL_TIMEOUT_S)

    async def _final_result(self, active: ActiveResponse) -> GenerationResult | None:
        """The cancelled generation's usage; the engine stops within a step, and we wait no longer."""
        if active.runner.stream is None:
            return None
        try:
            return await asyncio.wait_for(active.runner.stream.result(), timeout=USAGE_WAIT_S)
        except Exception:  # usage is best effort for a cancelled response
            return None
