"""What a Realtime response will be, from the session's configuration and the response's parameters.

Pure: the tools it may call (and with the built-in ones, memory's `remember`), its sampling, whether its
tool_choice names the memory tool, its prompt, and the whole plan (its events and the job its runner
does). Nothing here runs: responses.py starts what is planned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.generation.memory import MemoryAccount
from gateway.generation.service import PromptSpec
from gateway.platform.config import Settings
from gateway.platform.latency import TurnMarks
from gateway.platform.token_quota import TokenAccount
from gateway.protocol import client_events as ev
from gateway.protocol.chat import MEMORY_TOOL_NAME
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig, ToolChoiceFunction, check_tool_choice
from gateway.realtime.conversation import Conversation, Item, item_from_param, new_id, screen_item
from gateway.realtime.preemption import Preemption
from gateway.realtime.response_events import ResponseEvents
from gateway.safety.hooks import Classifier
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolFormat, ToolSpec, ToolUse, plan_tool_use

ToolsPlanner = Callable[[list[ToolSpec]], ToolUse]


@dataclass
class ResponseJob:
    messages: list[ChatMessage]
    sampling: SamplingParams
    conversation_key: str | None = None
    marks: TurnMarks = field(default_factory=TurnMarks)
    preemption: Preemption | None = None
    speech_speed: float = 1.0  # the session's audio.output.speed
    tool_use: ToolUse = field(default_factory=lambda: ToolUse([]))  # the client's tools the reply may call
    # The reply's tools with these built-in ones offered too (memory's `remember`): `tool_use` plus those.
    plan_tools: ToolsPlanner = lambda builtin: ToolUse([])
    names_memory_tool: bool = False  # tool_choice names `remember`: refused unless the key's memory is on
    safety: SafetyPolicy = field(default_factory=lambda: SafetyPolicy([]))  # on the reply as it streams
    tokens: TokenAccount | None = None  # the key's tokens per minute (token_quota.py)
    classifier: Classifier | None = None  # beside the rules (safety/hooks.py)
    memory: MemoryAccount | None = None  # the key's memory (gateway/generation/memory.py)
    classifier_timeout_s: float = 2.0


def reply_spec(messages: list[ChatMessage], tool_use: ToolUse) -> PromptSpec:
    """A reply's prompt, and the grammar of its forced function call."""
    grammar = f"start: {tool_use.forced_block}" if tool_use.forced_block is not None else None
    return PromptSpec(messages, tool_use.template_tools, grammar,
                      grammar_message="A function's parameters cannot be used as a JSON schema")


def tools_planner(config: SessionConfig, params: ev.ResponseParams, fmt: ToolFormat) -> ToolsPlanner:
    """Plans the reply's tools, as they are now, with the built-in ones given (memory's `remember`). A choice
    that names a built-in tool not given plans as "auto" (the response refuses it: see ResponseRunner)."""
    tools = params.tools if params.tools is not None else config.tools
    choice = params.tool_choice or config.tool_choice
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


def names_memory_tool(config: SessionConfig, params: ev.ResponseParams) -> bool:
    tools = params.tools if params.tools is not None else config.tools
    choice = params.tool_choice or config.tool_choice
    return (isinstance(choice, ToolChoiceFunction) and choice.name == MEMORY_TOOL_NAME
            and all(tool.name != MEMORY_TOOL_NAME for tool in tools))


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
    classifier: Classifier | None
    classifier_timeout_s: float
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
    fmt: ToolFormat,
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
    plan_tools = tools_planner(config, params, fmt)  # the tools as they are now
    tool_use = plan_tools([])
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
        messages=context.chat_messages(instructions),  # the runner adds what the tools need
        sampling=reply_sampling(config, settings, params, context_window),
        conversation_key=conversation.id if writes_conversation else None,
        marks=marks,
        preemption=preemption,
        speech_speed=config.audio.output.speed,
        tool_use=tool_use,
        plan_tools=plan_tools,
        names_memory_tool=names_memory_tool(config, params),
        safety=accounts.safety,
        tokens=accounts.tokens,
        memory=accounts.memory,
        classifier=accounts.classifier,
        classifier_timeout_s=accounts.classifier_timeout_s,
    )
    return ResponsePlan(events, job, writes_conversation)
