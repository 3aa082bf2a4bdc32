"""One reply's way from its request to the model, whichever API asked for it (a chat completion, a response of
the Responses API, a Realtime response and the voice reply made ahead of it, a conversation's message, a title):

1. recall: with the key's memory on, the memories that bear on the question (memory.py); a choice that names
   the memory tool while memory is off is refused;
2. plan: the prompt, its tools and the grammar of its output (chat_plan.py), the memories last;
3. prepare: the prompt rendered and its tokens reserved (service.py);
4. start: submitted (or an adopted generation read), with the memory tool's second round planned as the first.

Each API keeps only its wire: how it asks (a ReplyRequest) and how it renders the Reply it reads. Two prompts
built here from the same request are the same tokens: that is what lets a Realtime response adopt the reply
its voice turn started ahead (realtime/preemption.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.generation.chat_plan import ChatPlan, ReplyForm, plan_reply
from gateway.generation.memory import REMEMBER_TOOL, MemoryAccount, Recall, memory_off
from gateway.generation.memory_tool import Generation
from gateway.generation.service import Generator, MemoryRound, Prepared, PromptSpec, Reply
from gateway.platform.storage.conversations import ConversationStore
from gateway.platform.storage.responses import ResponseStore
from gateway.platform.token_quota import Reservation, TokenAccount
from gateway.protocol.errors import ApiError
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolFormat, ToolSpec


@dataclass(frozen=True)
class RunDeps:
    """What a run on this path for an API key (a chat completion, a response) draws on."""

    generator: Generator
    conversations: ConversationStore
    responses: ResponseStore
    tokens: TokenAccount
    memory: MemoryAccount  # the key's (recalled from only when the key turned it on)
    default_max_tokens: int
    repetition_penalty: float
    model_name: str  # a chat completion's system_fingerprint names it


@dataclass(frozen=True)
class PromptFields:
    """The request's fields that a prompt's errors blame, and in what words."""

    context: str | None = None  # a prompt past the context window
    schema: str | None = "tools"  # a JSON schema of the text's format (not of a tool) that cannot be compiled
    grammar_message: str = "The JSON schema cannot be used"

    def spec(self, plan: ChatPlan) -> PromptSpec:
        schema_param = self.schema if "%json" in (plan.grammar or "") and not plan.tools else "tools"
        return PromptSpec(plan.messages, plan.template_tools, plan.grammar, param=self.context,
                          grammar_param=schema_param, grammar_message=self.grammar_message)


@dataclass(frozen=True)
class ReplyRequest:
    """A reply to generate, in the terms every API shares."""

    messages: list[ChatMessage]  # the prompt before the tools' and the format's instructions
    form: ReplyForm
    sampling: SamplingParams
    fields: PromptFields = field(default_factory=PromptFields)
    # What memory reads the question from: the request's own input (by default, `messages`).
    question: Sequence[ChatMessage] | None = None
    save_memory: bool = True  # False: a draft, a regenerated reply, a reply made ahead (see memory.recall)
    truncated: ApiError | None = None  # raised when the prompt fits only with its oldest messages dropped


@dataclass
class PlannedReply:
    """A reply's prompt planned (not yet rendered): its plan, and what memory did for it (None: memory is off)."""

    request: ReplyRequest
    plan: ChatPlan
    remembered: Recall | None
    tool_format: ToolFormat

    @classmethod
    async def recall_and_plan(cls, request: ReplyRequest, tool_format: ToolFormat, memory: MemoryAccount | None, *,
                              recalled: Callable[[Recall], None] | None = None) -> PlannedReply:
        """`recalled` hears what memory found before anything is rendered (a Realtime response's metadata)."""
        question = request.messages if request.question is None else request.question
        remembered = await memory.recall(question, save=request.save_memory) if memory is not None else None
        if remembered is None and request.form.names_memory_tool:
            raise memory_off()
        if remembered is not None and recalled is not None:
            recalled(remembered)
        builtin = [REMEMBER_TOOL] if remembered is not None else []
        return cls(request, _plan(request.form, request.messages, tool_format, builtin, remembered), remembered,
                   tool_format)

    @property
    def offers_memory_tool(self) -> bool:
        """The model may save memories itself: the reply then goes on in a second round after its calls."""
        return self.remembered is not None and self.plan.builtin_offered

    def after_save(self, added: list[ChatMessage]) -> PromptSpec:
        """The second round's prompt: the same request with the calls and their results, without the memory tool."""
        request = self.request
        plan = _plan(request.form.after_memory_saved(), [*request.messages, *added], self.tool_format, [],
                     self.remembered)
        return request.fields.spec(plan)


def _plan(form: ReplyForm, messages: list[ChatMessage], tool_format: ToolFormat, builtin: list[ToolSpec],
          remembered: Recall | None) -> ChatPlan:
    plan = plan_reply(form, tool_format, messages=messages, builtin=builtin)
    if remembered is not None:  # the prompt's last: see Recall.messages
        plan.messages += remembered.messages()
    return plan


class ReplyPath:
    """One reply planned, rendered and its tokens reserved (`prepare`); `start` runs it."""

    def __init__(self, generator: Generator, planned: PlannedReply, prepared: Prepared) -> None:
        self.generator = generator
        self.planned = planned
        self.prepared = prepared

    @classmethod
    async def prepare(cls, generator: Generator, request: ReplyRequest, *, memory: MemoryAccount | None = None,
                      tokens: TokenAccount | None = None,
                      recalled: Callable[[Recall], None] | None = None) -> ReplyPath:
        """Recall, plan, render and reserve (429 past the key's tokens per minute). Raises ApiError."""
        planned = await PlannedReply.recall_and_plan(request, generator.engine.lm.tool_format, memory,
                                                     recalled=recalled)
        rendered = await generator.render(request.fields.spec(planned.plan), request.sampling.max_tokens)
        if rendered.prompt.dropped_messages and request.truncated is not None:
            raise request.truncated
        return cls(generator, planned, await generator.reserve(rendered, request.sampling, tokens))

    @property
    def plan(self) -> ChatPlan:
        return self.planned.plan

    @property
    def remembered(self) -> Recall | None:
        return self.planned.remembered

    @property
    def prompt_ids(self) -> list[int]:
        return self.prepared.prompt_ids

    @property
    def offers_memory_tool(self) -> bool:
        return self.planned.offers_memory_tool

    @property
    def client_reads_constraint(self) -> bool:
        """The output is constrained (a forced call, JSON) and is the client's to read: a forced call of the
        memory tool is not (its calls run out of the client's sight)."""
        return self.plan.grammar is not None and not self.planned.request.form.names_memory_tool

    @property
    def reservation(self) -> Reservation | None:
        return self.prepared.reservation

    async def start(self, *, routing_key: str | None = None, conversation_id: str | None = None,
                    background: bool = False, adopted: Generation | None = None) -> Reply:
        """Submit it, or read `adopted` (its generation, already running): see Generator.start."""
        planned = self.planned
        memory = None
        if planned.remembered is not None and planned.offers_memory_tool:
            memory = MemoryRound(planned.remembered, planned.plan.tools, planned.after_save)
        return await self.generator.start(self.prepared, routing_key=routing_key, conversation_id=conversation_id,
                                          background=background, memory=memory, adopted=adopted)
