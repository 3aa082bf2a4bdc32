"""Replies made ahead of a user's turn: its reply generated from the speculative transcript (preemption) and the
prompt before the turn, for the prefill while the user speaks. Not a driver: the voice pipeline's head start
asks it, with the context the core gave (commands.ReplyContext), and it builds each request with the response's
own builder (response_plan.reply_request), so a turn's response adopts what was made when nothing changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.generation.memory import MemoryAccount
from gateway.generation.reply_path import PlannedReply, ReplyPath
from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.platform.latency import now
from gateway.protocol import client_events as ev
from gateway.protocol.errors import ApiError
from gateway.realtime.commands import ReplyContext
from gateway.realtime.preemption import Preemption
from gateway.realtime.response_plan import reply_form, reply_request
from gateway.safety.policy import SafetyPolicy
from inference.llm.chat import ChatMessage


def screened(safety: SafetyPolicy, text: str) -> str | None:
    """A user's words as the model may read them ahead of their turn (a speculative transcript): redacted, or
    None when the policy refuses them."""
    if not safety:
        return text
    verdict = safety.screen(text)
    return None if verdict.blocked is not None else verdict.text


@dataclass
class ReplyAhead:
    runtime: Runtime
    settings: Settings
    memory: MemoryAccount | None  # the key's memory, when it turned it on
    responding: Callable[[], bool]  # a response is in progress: it holds the engine

    async def preempt(self, context: ReplyContext, user_item_id: str, user_text: str) -> Preemption | None:
        """Start generating the default reply to a user turn that may not be committed yet, from its speculative
        transcript; the turn's response adopts the stream when its prompt turns out the same. None when no reply
        can start now (a response is running, no model, the engine is full, the words are refused)."""
        engine = self.runtime.engine
        if engine is None or self.responding():
            return None
        config, params = context.config, ev.ResponseParams()
        form = reply_form(config, params)
        if form.tools and form.choice != "none":
            return None  # a reply that may call functions has their instructions and maybe a grammar
        words = screened(self.runtime.safety, user_text)
        if words is None:
            return None  # refused: the turn's final transcript will say so
        # The response's own builder, from what the response will have: adopted when the prompts are the same.
        request = reply_request(config, self.settings, params, form, [*context.history, ChatMessage("user", words)],
                                engine.lm.context_window, save_memory=False)
        try:
            # No tokens reserved: the response that adopts it reserves them.
            path = await ReplyPath.prepare(self.runtime.generator(), request, memory=self.memory)
            if self.responding():
                return None
            reply = await path.start(conversation_id=context.conversation_id)
        except ApiError:
            return None  # the response itself will meet (and report) the same condition
        return Preemption(prompt_ids=path.prompt_ids, sampling=request.sampling, stream=reply, started_at=now())

    async def draft_prompt(self, context: ReplyContext, user_text: str) -> list[ChatMessage] | None:
        """The messages before a user turn still being spoken, as the default response to it will have them (the
        same builder): with the tools' instructions and, with the key's memory on, the memories that bear on what
        was said so far (nothing is saved from a draft). None when that response would be refused."""
        engine = self.runtime.engine
        if engine is None:
            return None
        config, params = context.config, ev.ResponseParams()
        request = reply_request(config, self.settings, params, reply_form(config, params), context.history,
                                engine.lm.context_window, save_memory=False)
        try:
            planned = await PlannedReply.recall_and_plan(
                replace(request, question=[*context.history, ChatMessage("user", user_text)]), engine.lm.tool_format,
                self.memory)
        except ApiError:
            return None
        return planned.plan.messages
