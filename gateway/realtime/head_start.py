"""A voice turn's head start: its reply generated ahead from the speculative final transcript (preemption,
which the turn's response adopts when its prompt is the same), and the conversation so far prefilled into the
engine's cache while the user speaks. Both ask the response driver, which owns replies; the voice pipeline
owns the tasks (it passes its `spawn`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gateway.generation.runtime import Runtime
from gateway.protocol.session_config import SessionConfig
from gateway.realtime.conversation import Conversation
from gateway.realtime.preemption import Preemption
from gateway.realtime.responses import ResponseDriver
from inference.asr import Transcript
from inference.llm.chat import ChatMessage, draft_prompt_ids

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class HeadStartHost(Protocol):
    """What a head start needs of its session (session.py's RealtimeSession)."""

    id: str
    runtime: Runtime

    @property
    def config(self) -> SessionConfig: ...

    @property
    def conversation(self) -> Conversation: ...

    @property
    def response_driver(self) -> ResponseDriver: ...

    def screened(self, text: str) -> str | None: ...

    def speaks_by_default(self) -> bool: ...


class HeadStart:
    def __init__(self, session: HeadStartHost) -> None:
        self.session = session

    async def preempt(self, item_id: str, speculative: asyncio.Task[Transcript | None], spawn: Spawn) -> Preemption | None:
        """The turn's reply started from its speculative transcript, and its speech made ahead (`spawn`)."""
        session = self.session
        transcript = await asyncio.shield(speculative)  # cancelled with it when the user goes on speaking
        if transcript is None or not transcript.text.strip():
            return None
        preemption = await session.response_driver.preempt_reply(item_id, transcript.text)
        log.debug("session %s: reply preempted: %s", session.id, "started" if preemption is not None else "not possible now")
        if preemption is not None:
            tts = session.runtime.tts if session.speaks_by_default() else None
            spawn(preemption.run_ahead(tts, session.config.audio.output.speed))
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

    def prefill_draft(self, user_text: str) -> Coroutine[Any, Any, None] | None:
        """The core's PrefillDraft: the conversation plus what the user has said so far, to prefill (the
        caller runs it); None where there is nothing to prefill."""
        session = self.session
        if session.runtime.engine is None:
            return None
        draft = session.screened(user_text)
        if draft is None:
            return None  # the model never reads a refused message, not even ahead of time
        return self._prefill(session.conversation.chat_messages(session.config.instructions), draft)

    async def _prefill(self, messages: list[ChatMessage], user_text: str) -> None:
        session = self.session
        engine = session.runtime.engine
        assert engine is not None
        # The reply's prompt before the turn: with memory on, memories and the memory tool (all merged into its
        # first message).
        before = await session.response_driver.draft_prompt(messages, user_text)
        if before is None:
            return
        ids = await asyncio.to_thread(draft_prompt_ids, engine.lm.tokenizer, before, user_text)
        if ids and len(ids) < engine.lm.context_window:
            with contextlib.suppress(Exception):  # a prefill is only a head start; the response recomputes
                await engine.prefill(ids, conversation_id=session.conversation.id)
