"""Running a session's Realtime responses: the runner of one (prompt, token stream, text deltas, speech clause
by clause) and the owner of its task (ResponseDriver: start, stop, end), both feeding what happens to the core."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from gateway.generation.memory import Recall
from gateway.generation.reply_path import ReplyPath
from gateway.generation.runtime import Runtime
from gateway.generation.service import Generator, Reply
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.platform.latency import TurnMarks
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig
from gateway.realtime.commands import CreateResponse, ResponseFinished, StopResponse
from gateway.realtime.inputs import (
    ClauseSpoken,
    ErrorOccurred,
    FunctionCallsMade,
    Input,
    MessageOpened,
    MetadataAdded,
    ResponseEnded,
    ResponseFiltered,
    ResponseStarted,
    SpeechWritten,
    TextDelta,
    TokensReserved,
)
from gateway.realtime.preemption import AdoptedStream, Preemption
from gateway.realtime.response_events import ResponseEvents, ResponseStatus, TokenUsage
from gateway.realtime.response_plan import Accounts, ResponseJob, plan_response
from gateway.realtime.speech_out import SpeechFactory, SpeechStream, SpeechTarget
from gateway.safety.output import ContentFiltered
from inference.llm.backend import GenerationResult
from inference.llm.tool_calls import ReplySplitter, parse_reply
from inference.text import ClauseSplitter
from inference.tts import TtsEngine
from media.playout import PlayoutBuffer

log = logging.getLogger(__name__)

# How long a cancelled response task may take to unwind before the session stops waiting.
CANCEL_TIMEOUT_S = 2.0
# A cancel's wait for the token counts: the in-process engine answers at once, a remote one as its request unwinds.
USAGE_WAIT_S = 0.15
# A spoken reply whose audio made so far plays on for more than this needs no token now: the engine leaves
# it out of steps that other replies' prompts and first words need (Scheduler.schedule). It covers the next
# clause's ~10 tokens and its synthesis on a busy CPU (0.3-0.5 s each at 8 sessions) with room to spare.
SPEECH_LEAD_S = 2.0


class ResponseRunner:
    def __init__(
        self,
        *,
        generator: Generator,
        tts: TtsEngine | None,
        job: ResponseJob,
        events: ResponseEvents,
        feed: Callable[[Input], None],
        speech: SpeechStream | None,
    ) -> None:
        """`feed` takes what the run makes to the session's core, as inputs: the tokens reserved, the assistant
        message opened (before its first text, when the core did not open it upfront), function calls, text."""
        self.generator = generator
        self.tts = tts
        self.job = job
        self.events = events
        self.feed = feed
        self.speech = speech
        self.stream: Reply | None = None
        self._adopted: Preemption | None = None
        # Text that may begin a match waits for the rest of it; the classifier runs beside the generation.
        self.guard = self.generator.guard(self.cancel_generation, marks=job.marks)

    async def run(self) -> GenerationResult:
        job = self.job
        try:
            # With the key's memory on, the memories that bear on the question join the prompt, and the
            # response's metadata lists them (and what the reply saved: see _generate).
            path = await ReplyPath.prepare(self.generator, job.request, memory=job.memory, tokens=job.tokens,
                                           recalled=self._recalled)
        except BaseException:
            self.cancel_generation()
            raise
        if path.client_reads_constraint:  # the client's forced call: JSON, which labels must keep
            self.guard.expect_json()
        reservation = path.reservation
        if reservation is not None:  # as OpenAI: the tokens reserved for this response, given back at its end
            self.feed(TokensReserved(self.events.response_id, reservation.rate_limit()))
        self.guard.start(next((m.content for m in reversed(job.request.messages) if m.role == "user"), ""))
        try:
            return await self._generate(path)
        finally:
            await self.guard.close()
            if self.stream is not None:  # settles the tokens (a submit that failed settled them itself)
                await self.stream.close()

    def _recalled(self, remembered: Recall) -> None:
        self.feed(MetadataAdded(self.events.response_id, remembered.metadata()))

    async def _generate(self, path: ReplyPath) -> GenerationResult:
        job = self.job
        preemption, job.preemption = job.preemption, None
        adopted: AdoptedStream | None = None
        # Made ahead by the same builder and reply path (ReplyAhead.preempt), its prompt differs only
        # when the conversation, the final transcript or the memories did (this response saved the question's fact).
        if (preemption is not None and path.prepared.rendered.constraint is None
                and preemption.prompt_ids == path.prompt_ids and preemption.sampling == job.request.sampling):
            self._adopted = preemption
            adopted = AdoptedStream(preemption)  # run_ahead reads the stream; its text is replayed
            job.marks.generation_started = preemption.started_at
            metrics.PREEMPTIONS.labels("adopted").inc()
        elif preemption is not None:
            log.debug("preempted reply dropped: the response's prompt or sampling differs")
            preemption.cancel()
        self.stream = deltas = await path.start(conversation_id=job.conversation_key, adopted=adopted)
        if adopted is None:
            job.marks.mark("generation_started")
        tools = path.plan.tools
        # With tools, text that may begin a call block waits until it is known (tool_calls.py).
        reply = ReplySplitter() if tools else None
        clauses: asyncio.Queue[str | None] = asyncio.Queue()
        splitter = ClauseSplitter()

        def say(text: str) -> None:
            if not self.events.opened:
                self.feed(MessageOpened(self.events.response_id))
            self.feed(TextDelta(self.events.response_id, text))
            if self.speech is not None:
                for clause in splitter.push(text):
                    job.marks.mark("first_clause")
                    clauses.put_nowait(clause)

        guard = self.guard

        def release(safe: str) -> None:
            text = reply.feed(safe) if reply is not None else safe
            if text:
                say(text)
            if guard.blocked is not None:
                self.cancel_generation()  # stopped at once; the session ends the response (content_filter)
                guard.check()

        try:
            async with asyncio.TaskGroup() as group:
                if self.speech is not None:
                    group.create_task(self._speak(clauses))
                async for delta in deltas:
                    job.marks.mark("first_token")
                    release(guard.feed(delta))
                release(guard.flush())
                await guard.finish()  # the classifier's last verdicts
                release("")
                if reply is not None and reply.held:
                    parsed = parse_reply(reply.held, tools)
                    if parsed.calls:
                        self.feed(FunctionCallsMade(self.events.response_id, parsed.calls))
                    if parsed.content:
                        say(parsed.content)
                for clause in splitter.flush():
                    job.marks.mark("first_clause")
                    clauses.put_nowait(clause)
                clauses.put_nowait(None)
        except* ApiError as failed:  # the backend failed mid-stream (a remote one went down), or a memory round
            raise failed.exceptions[0] from None
        except* ContentFiltered as filtered:  # the speech task is cancelled with it: nothing more is said
            raise filtered.exceptions[0] from None
        finally:
            if path.remembered is not None and path.offers_memory_tool:  # what the model saved
                self.feed(MetadataAdded(self.events.response_id, path.remembered.metadata()))
        return await deltas.result()

    def release_held(self) -> None:
        """A cancelled text reply (its task stopped): the text the policy still held, screened as the end of the
        reply, goes out as its last delta, so the item holds everything generated before the cancel."""
        if self.speech is None and not self.job.client_tools and self.events.opened:
            if text := self.guard.flush():
                self.feed(TextDelta(self.events.response_id, text))

    def cancel_generation(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        if self.job.preemption is not None:  # cancelled before run() took or dropped it
            self.job.preemption.cancel()

    async def _speak(self, clauses: asyncio.Queue[str | None]) -> None:
        assert self.tts is not None and self.speech is not None
        response_id = self.events.response_id
        first = True
        # When the audio written so far will have played (time.monotonic()), were the listener to play it as it
        # comes: a later clause is due then, and the TTS worker serves other replies' first clauses before it.
        plays_until: float | None = None
        while (clause := await clauses.get()) is not None:
            # Only the first clause can have been spoken ahead, by an adopted preemption.
            made_ahead = None
            if first and self._adopted is not None and self._adopted.speech_speed == self.job.speech_speed:
                made_ahead = await self._adopted.audio_for(clause)
            speed = self.job.speech_speed
            audio = (self._iterate(made_ahead) if made_ahead is not None else
                     self.tts.synthesize(clause, first_clause=first, speed=speed, deadline=plays_until))
            first = False
            synthesis_started = time.perf_counter()
            async for pcm in audio:
                self.speech.write(pcm)
                seconds = len(pcm) / self.tts.sample_rate
                written = time.monotonic()
                plays_until = max(plays_until or written, written) + seconds
                if self.stream is not None:  # the reply's next words are not needed yet: see SPEECH_LEAD_S
                    self.stream.pace(plays_until - SPEECH_LEAD_S)
                self.feed(SpeechWritten(response_id, 1000.0 * seconds))
            if made_ahead is None:
                metrics.TTS_CLAUSE_SECONDS.observe(time.perf_counter() - synthesis_started)
            self.feed(ClauseSpoken(response_id, clause))
        self.speech.close()

    @staticmethod
    async def _iterate(chunks: list[np.ndarray]) -> AsyncIterator[np.ndarray]:
        for chunk in chunks:
            yield chunk


@dataclass
class RunningResponse:
    """The driver's side of the core's response in progress: what runs it, and its latency marks."""

    events: ResponseEvents
    runner: ResponseRunner
    marks: TurnMarks
    config: SessionConfig  # the session's when it started: its log record names its model and trace
    task: asyncio.Task[None] | None = None


class ResponseDriver:
    """A session's responses, as the core commands them: CreateResponse plans one and starts its task,
    StopResponse stops it, and either way its end goes back to the core as ResponseEnded. Owns the
    response's task and the stoppers that end a cancelled one once it is awaited; also starts a turn's
    reply ahead of the turn (voice preemption), with the same plan."""

    def __init__(self, feed: Callable[[Input], None], *, runtime: Runtime, settings: Settings, accounts: Accounts,
                 speech: SpeechFactory | None, playout: PlayoutBuffer | None, session_id: str,
                 request_id: str | None) -> None:
        """`feed` takes what happens to the session's core, as inputs. `speech` makes a spoken response's audio
        stream (None: the session has nowhere to send audio); `playout` (WebRTC) knows what the user heard."""
        self.feed = feed
        self.runtime = runtime
        self.settings = settings
        self.accounts = accounts
        self.speech = speech
        self.playout = playout
        self.session_id = session_id  # for the log
        self.request_id = request_id
        self.count = 0  # responses done
        self._run: RunningResponse | None = None
        self._stoppers: set[asyncio.Task[None]] = set()  # each ends a cancelled response once its task is done

    def running(self) -> bool:
        """A response is in progress: it holds the engine (a reply made ahead does not start then)."""
        return self._run is not None

    # -- starting -----------------------------------------------------------------------------------

    def create(self, command: CreateResponse, marks: TurnMarks, preemption: Preemption | None) -> None:
        """The core's CreateResponse (a client's response.create, a user turn's reply, or the idle nudge), with
        the turn's latency marks and its reply generated ahead: refused, it is an `error` event."""
        try:
            self._start(command, marks, preemption)
        except ApiError as error:
            if preemption is not None:
                preemption.cancel()
            error.event_id = command.event_id
            self.feed(ErrorOccurred(error))

    def _start(self, command: CreateResponse, marks: TurnMarks, preemption: Preemption | None) -> None:
        """Start a response now (synchronously), or raise. ``preemption``: a generation already started for this
        reply (reply_ahead.py); the response takes it over when its prompt is the same, and cancels it otherwise."""
        session = command.session
        assert session is not None, "the core gives every CreateResponse what it is planned from"
        engine = self.runtime.engine
        if engine is None:
            raise ApiError("model_not_ready", "The model is still loading.", type="server_error", status=503)
        plan = plan_response(session.config, self.settings, session.conversation, command.params,
                             context_window=engine.lm.context_window, can_speak=session.can_speak,
                             accounts=self.accounts, marks=marks, preemption=preemption)
        events = plan.events
        speech = None
        if events.audio and self.speech is not None and self.runtime.tts is not None:
            target = SpeechTarget(self.feed, session.config.audio.output.format, self.playout, self.runtime.tts.sample_rate)
            speech = self.speech(target, events, marks)
        runner = ResponseRunner(generator=self.runtime.generator(), tts=self.runtime.tts, job=plan.job, events=events,
                                feed=self.feed, speech=speech)
        # With tools, the message opens with its first text: the reply may be calls. The core refuses it (ApiError)
        # while another response is in progress: the one place that knows.
        self.feed(ResponseStarted(events, plan.writes_conversation, open_message=not plan.job.client_tools))
        assert self._run is None, "the core ends a response (ResponseFinished) before it starts another"
        run = RunningResponse(events=events, runner=runner, marks=marks, config=session.config)
        self._run = run
        run.task = asyncio.create_task(self._run_response(run), name=f"response {events.response_id}")

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
        except Exception:  # a defect of ours: the log has it, the client our words (never the exception's)
            log.exception("response %s failed", run.events.response_id)
            error = ApiError("internal_error", "The server failed to make the response.", type="server_error", status=500)
            self._end(run, "failed", error=error)
        else:
            status: ResponseStatus = "incomplete" if result.finish_reason == "length" else "completed"
            self._end(run, status, reason="max_output_tokens" if status == "incomplete" else None, result=result)

    # -- ending ---------------------------------------------------------------------------------------

    def _end(self, run: RunningResponse, status: ResponseStatus, *, reason: str | None = None,
             result: GenerationResult | None = None, error: ApiError | None = None) -> None:
        run.marks.mark("done")
        usage = None
        if result is not None:
            usage = TokenUsage(result.prompt_tokens, result.cached_prompt_tokens, result.completion_tokens)
            if result.admitted_at is not None:
                metrics.QUEUE_WAIT_SECONDS.labels("realtime").observe(result.admitted_at - result.submitted_at)
        playout = self.playout
        heard_ms = playout.played_ms(run.events.item.id) if playout is not None else None
        self.feed(ResponseEnded(run.events.response_id, status, run.marks.to_wire(), reason=reason, usage=usage,
                                     error=error, heard_ms=heard_ms))

    def finished(self, done: ResponseFinished) -> None:
        """The core's ResponseFinished (response.done was sent): count and log it."""
        run = self._run
        if run is None or run.events is not done.events:
            return
        self._run = None
        metrics.RESPONSES.labels(done.status).inc()
        self._log(run, done)
        for stage, seconds in run.marks.stage_durations().items():
            metrics.STAGE_SECONDS.labels(stage).observe(seconds)
            if stage == "voice_to_voice":
                self.runtime.admission.record(self.session_id, seconds)

    def _log(self, run: RunningResponse, done: ResponseFinished) -> None:
        """One record per response: ids, status, token counts and latency marks (the answer only with
        --log-content). With session.tracing, the trace's names and metadata go with it."""
        config = run.config
        tracing = config.tracing
        named = tracing if tracing is not None and not isinstance(tracing, str) else None
        events, usage, error = run.events, done.usage, done.error
        text = events.item.content[0].get("transcript" if events.audio else "text") if events.opened else None
        self.count += 1
        log_event(
            "realtime.response.done", session_id=self.session_id, request_id=self.request_id, response_id=events.response_id,
            conversation_id=events.conversation_id, model=config.model, status=done.status, reason=done.reason,
            error_code=error.get("code") if error else None,
            input_tokens=usage.input_tokens if usage else None, cached_tokens=usage.cached_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None, modality="audio" if events.audio else "text",
            latency_ms=run.marks.to_wire(),
            trace={"workflow_name": (named and named.workflow_name) or "Realtime Session",
                   "group_id": named and named.group_id, "metadata": named and named.metadata} if tracing else None,
            content={"output_text": text} if text is not None else None,
        )

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self, command: StopResponse) -> None:
        """The core's StopResponse."""
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

    async def settle(self) -> None:
        """Wait until the responses being stopped have ended (their response.done is sent)."""
        while self._stoppers:
            await asyncio.wait(set(self._stoppers))

    async def close(self) -> None:
        """The session is closing (its outbox is closed): stop the response quietly."""
        if self._run is not None:
            await self._stop_task(self._run)
        if self._stoppers:
            await asyncio.wait(set(self._stoppers), timeout=CANCEL_TIMEOUT_S + USAGE_WAIT_S)
        # A finished task keeps its frame (and so this session) in its result or CancelledError: let them go.
        self._run = None
        self._stoppers.clear()
