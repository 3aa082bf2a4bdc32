"""What a Realtime response will be, from the session's configuration and the response's parameters.

Pure: the reply it asks for (`reply_request`: its messages, the tools it may call, its sampling), the one
builder of both a response's reply and the voice reply made ahead of it (so that the response can adopt that
one), and the whole plan (its events and the job its runner does). Nothing here runs: responses.py starts what
is planned, through the one reply path (gateway/generation/reply_path.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.generation.chat_plan import ReplyForm
from gateway.generation.memory import MemoryAccount
from gateway.generation.reply_path import PromptFields, ReplyRequest
from gateway.platform.config import Settings
from gateway.platform.latency import TurnMarks
from gateway.platform.token_quota import TokenAccount
from gateway.protocol import client_events as ev
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig, ToolChoiceFunction, check_tool_choice
from gateway.realtime.conversation import Conversation, Item, item_from_param, new_id, screen_item
from gateway.realtime.preemption import Preemption
from gateway.realtime.response_events import ResponseEvents
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolSpec

# A Realtime reply names no request field in its prompt's errors, and its only grammar is a forced call's.
REALTIME_FIELDS = PromptFields(grammar_message="A function's parameters cannot be used as a JSON schema")


@dataclass
class ResponseJob:
    request: ReplyRequest  # the reply: recalled, planned and started by the reply path
    conversation_key: str | None = None
    marks: TurnMarks = field(default_factory=TurnMarks)
    preemption: Preemption | None = None
    speech_speed: float = 1.0  # the session's audio.output.speed
    tokens: TokenAccount | None = None  # the key's tokens per minute (token_quota.py)
    memory: MemoryAccount | None = None  # the key's memory (gateway/generation/memory.py)

    @property
    def client_tools(self) -> list[ToolSpec]:
        """The client's tools the reply may call (what it is parsed for)."""
        form = self.request.form
        return [] if form.choice == "none" else form.tools


def reply_form(config: SessionConfig, params: ev.ResponseParams) -> ReplyForm:
    """The reply's tools, as they are now, and its tool_choice (which may name memory's `remember`)."""
    tools = params.tools if params.tools is not None else config.tools
    choice = params.tool_choice or config.tool_choice
    try:
        check_tool_choice(tools, choice)
    except ValueError as exc:
        raise ApiError("invalid_value", str(exc), "response.tool_choice") from None
    specs = [ToolSpec(tool.name, tool.description, tool.parameters) for tool in tools]
    if isinstance(choice, ToolChoiceFunction):
        return ReplyForm(specs, "function", choice.name)
    return ReplyForm(specs, choice)


def reply_request(config: SessionConfig, settings: Settings, params: ev.ResponseParams, form: ReplyForm,
                  messages: list[ChatMessage], context_window: int, *, save_memory: bool = True) -> ReplyRequest:
    """The reply to `messages`: a response's, and the voice reply made ahead of its turn (save_memory False)."""
    return ReplyRequest(messages, form, reply_sampling(config, settings, params, context_window), REALTIME_FIELDS,
                        save_memory=save_memory)


def reply_sampling(config: SessionConfig, settings: Settings, params: ev.ResponseParams,
                   context_window: int) -> SamplingParams:
    max_tokens = params.max_output_tokens or config.max_output_tokens
    if max_tokens == "inf":
        max_tokens = context_window // 2
    return SamplingParams(
        temperature=next(t for t in (params.temperature, config.temperature, settings.realtime_temperature)
                         if t is not None),
        max_tokens=int(max_tokens),
        repetition_penalty=settings.repetition_penalty,
    )


@dataclass(frozen=True)
class Accounts:
    """What a response of this session draws on and answers to: its key's tokens and memory, the policy."""

    safety: SafetyPolicy
    tokens: TokenAccount | None
    memory: MemoryAccount | None


@dataclass(frozen=True)
class ResponsePlan:
    events: ResponseEvents
    job: ResponseJob
    writes_conversation: bool


def plan_response(
    config: SessionConfig,
    settings: Settings,
    conversation: Conversation,
    params: ev.ResponseParams,
    *,
    context_window: int,
    can_speak: bool,
    accounts: Accounts,
    marks: TurnMarks,
    preemption: Preemption | None,
) -> ResponsePlan:
    """The response `params` ask for, or the ApiError that refuses it (nothing has changed then)."""
    modalities = params.output_modalities or config.output_modalities
    audio = "audio" in modalities
    if audio and not can_speak:
        raise ApiError("invalid_value", "Audio output is not available in this session.", "response.output_modalities")
    instructions = params.instructions if params.instructions is not None else config.instructions
    form = reply_form(config, params)  # the tools as they are now
    if params.conversation not in ("auto", "none", conversation.id):
        raise ApiError("invalid_value", f"Unknown conversation '{params.conversation}': 'auto', 'none' or this "
                       f"session's '{conversation.id}'.", "response.conversation")
    writes_conversation = params.conversation != "none"
    context = conversation
    if params.input is not None:
        context = Conversation(max_items=settings.max_conversation_items, max_bytes=settings.max_conversation_bytes)
        for param in params.input:
            item = item_from_param(param)
            screen_item(accounts.safety, item)
            context.add(item)
    if not len(context):
        raise ApiError("empty_conversation", "There is nothing to respond to: add a message first.")
    marks.mark("response_created")
    events = ResponseEvents(
        response_id=new_id("resp"),
        conversation_id=conversation.id if writes_conversation else None,
        item=Item(id=new_id("item"), type="message", role="assistant", status="in_progress"),
        audio=audio,
        audio_format=config.audio.output.format.model_dump(),
        voice=config.audio.output.voice,
        max_output_tokens=params.max_output_tokens or config.max_output_tokens,
        metadata=dict(params.metadata) if params.metadata else None,
    )
    job = ResponseJob(
        # The reply path adds what the tools and memory need.
        request=reply_request(config, settings, params, form, context.chat_messages(instructions), context_window),
        conversation_key=conversation.id if writes_conversation else None,
        marks=marks,
        preemption=preemption,
        speech_speed=config.audio.output.speed,
        tokens=accounts.tokens,
        memory=accounts.memory,
    )
    return ResponsePlan(events, job, writes_conversation)
