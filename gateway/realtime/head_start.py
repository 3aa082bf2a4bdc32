"""A voice turn's head start: its reply generated ahead from the speculative final transcript (preemption,
which the turn's response adopts when its prompt is the same), and the conversation so far prefilled into the
engine's cache while the user speaks. Both are built by ReplyAhead from the context the core's command carries;
the voice pipeline owns the tasks (it passes its `spawn`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.realtime.commands import ReplyContext
from gateway.realtime.preemption import Preemption
from gateway.realtime.reply_ahead import ReplyAhead, screened
from inference.asr import Transcript
from inference.llm.chat import draft_prompt_ids

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class HeadStart:
    def __init__(self, replies: ReplyAhead, session_id: str) -> None:
        self.replies = replies
        self.session_id = session_id  # for the log

    async def preempt(self, item_id: str, context: ReplyContext, speculative: asyncio.Task[Transcript | None],
                      spawn: Spawn) -> Preemption | None:
        """The turn's reply started from its speculative transcript, and its speech made ahead (`spawn`)."""
        transcript = await asyncio.shield(speculative)  # cancelled with it when the user goes on speaking
        if transcript is None or not transcript.text.strip():
            return None
        preemption = await self.replies.preempt(context, item_id, transcript.text)
        log.debug("session %s: reply preempted: %s", self.session_id,
                  "started" if preemption is not None else "not possible now")
        if preemption is not None:
            tts = self.replies.runtime.tts if context.speaks else None
            spawn(preemption.run_ahead(tts, context.config.audio.output.speed))
        return preemption

    async def take(self, task: asyncio.Task[Preemption | None] | None) -> Preemption | None:
        """The turn's preempted reply, if one started. The response decides whether it fits: its prompt
        holds the final transcript, so a reply to another transcript has another prompt."""
        if task is None:
            return None
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            self.discard(task)
            raise
        return None if task.cancelled() or task.exception() is not None else task.result()

    @staticmethod
    def discard(task: asyncio.Task[Preemption | None]) -> None:
        def cancel_stream(done: asyncio.Task[Preemption | None]) -> None:
            if not done.cancelled() and done.exception() is None and (preemption := done.result()) is not None:
                preemption.cancel()

        task.cancel()
        task.add_done_callback(cancel_stream)  # also when it had already finished

    def prefill_draft(self, context: ReplyContext, user_text: str) -> Coroutine[Any, Any, None] | None:
        """The core's PrefillDraft: the conversation plus what the user has said so far, to prefill (the
        caller runs it); None where there is nothing to prefill."""
        if self.replies.runtime.engine is None:
            return None
        draft = screened(self.replies.runtime.safety, user_text)
        if draft is None:
            return None  # the model never reads a refused message, not even ahead of time
        return self._prefill(context, draft)

    async def _prefill(self, context: ReplyContext, user_text: str) -> None:
        engine = self.replies.runtime.engine
        assert engine is not None
        # The reply's prompt before the turn: with memory on, memories and the memory tool (all merged into its
        # first message).
        before = await self.replies.draft_prompt(context, user_text)
        if before is None:
            return
        ids = await asyncio.to_thread(draft_prompt_ids, engine.lm.tokenizer, before, user_text)
        if ids and len(ids) < engine.lm.context_window:
            with contextlib.suppress(Exception):  # a prefill is only a head start; the response recomputes
                await engine.prefill(ids, conversation_id=context.conversation_id)
