"""A session's listening side: input audio, VAD turns, partial and final transcripts, barge-in.

Audio arrives as 16 kHz chunks (WebRTC reader, or decoded `input_audio_buffer.append`). One
task per session runs the VAD on a shared worker thread, in order; transcription jobs are tasks
owned here, cancelled and awaited on close. To shorten the wait after the user stops:
- partial transcripts run while the user speaks; the core takes their stable words, which are
  prefilled into the conversation's KV cache (PrefillDraft);
- a speculative final transcript starts when the core says so (StartSpeculation, after a short
  silence), and is used when the turn really ends there; so is a partial whose audio already covers
  the end of speech (partials and finals decode the same way, so its text is the final text);
- the reply is generated from that speculative transcript while the VAD waits out the silence
  (preemption); the response adopts it when the final transcript is the same, and it is cancelled
  when the user goes on speaking (DiscardSpeculation). Nothing is sent for it before the turn is
  committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.generation.runtime import Runtime
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.platform.latency import TurnMarks, now
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SEMANTIC_WAITS_MS, AudioInput, SemanticVad, TurnDetection
from gateway.realtime.commands import ReplyContext
from gateway.realtime.conversation import new_id
from gateway.realtime.head_start import HeadStart
from gateway.realtime.input_buffer import RATE, InputAudioBuffer
from gateway.realtime.input_decoder import InputDecoder
from gateway.realtime.inputs import (
    AudioCleared,
    AudioCommitted,
    AudioProcessed,
    EndOfTurnJudged,
    Input,
    SilenceHeard,
    SpeechBegan,
    SpeechEnded,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptionAbandoned,
    TranscriptPartial,
    TranscriptSpeculated,
    TurnReady,
)
from gateway.realtime.noise_stage import NoiseStage
from gateway.realtime.preemption import Preemption
from gateway.realtime.turn_judges import TurnJudges
from gateway.safety.screening import screen_text
from inference.asr import Transcript
from inference.cpu import charge
from inference.models import silero_vad_path
from media.frames import AudioChunk
from media.vad import SileroVad, StreamingVad, VadEvent, VadSettings, VadSpeechStarted, VadSpeechStopped

log = logging.getLogger(__name__)

PARTIAL_INTERVAL_S = 0.9  # a new partial transcript at most this often while the user speaks (each costs 0.15-0.3 s of ASR)
# A partial is made only of enough new speech: the first once this much is voiced (less is a word at most),
# each later one once as much again was voiced since the last (a partial of the same words is wasted work).
PARTIAL_VOICED_MS = 500
IDLE_KEEP_MS = 1000  # audio kept while nobody speaks (covers prefix_padding_ms)
ASR_TAIL_MS = 150  # audio after the VAD's end of speech still given to Whisper (soft word endings)
ASR_COVER_MS = 32  # a transcription reaching one VAD window past the end of speech counts as the final one


@dataclass
class UserTurn:
    item_id: str
    start: int  # stream index where the committed audio begins (onset minus prefix padding)
    partial_task: asyncio.Task[None] | None = None
    last_partial_at: float = 0.0
    voiced_at_last_partial: float = 0.0  # the VAD's voiced ms of the turn when the last partial started
    # Every transcription of this turn (partials and the speculative final): its audio's end, the job, and whether
    # it is decoded as the final is (so may stand in for it).
    jobs: list[tuple[int, asyncio.Task[Transcript | None], bool]] = field(default_factory=list)
    speculative: asyncio.Task[Transcript | None] | None = None
    preemption: asyncio.Task[Preemption | None] | None = None
    end_judge: asyncio.Task[None] | None = None  # semantic_vad: sets this silence's length from the words

    def covering(self, end: int) -> list[asyncio.Task[Transcript | None]]:
        """Jobs whose audio reaches `end`, the one that started first (so finishes first) first."""
        return [job for job_end, job, as_final in sorted(self.jobs, key=lambda entry: entry[0])
                if as_final and job_end >= end and not job.cancelled()]


@dataclass
class CommittedTurn:
    """What a committed user turn holds here until the core answers it (CreateResponse) or drops it (DropTurn)."""

    audio: np.ndarray
    marks: TurnMarks
    ready: list[asyncio.Task[Transcript | None]]  # transcriptions that may serve as its final one
    preemption: asyncio.Task[Preemption | None] | None = None  # its reply being started ahead
    head_start: Preemption | None = None  # that reply, once started


class VoicePipeline:
    def __init__(self, feed: Callable[[Input], None], settle: Callable[[], Awaitable[None]], *, runtime: Runtime,
                 settings: Settings, head_start: HeadStart, session_id: str, request_id: str | None,
                 narrowband: bool) -> None:
        """`feed` takes what happens to the session's core, as inputs; `settle` waits until the responses being
        stopped have ended (a barge-in's). `narrowband`: the audio is a phone call's G.711, brought up to 16 kHz."""
        self.feed = feed
        self.settle = settle
        self.runtime = runtime
        self.settings = settings
        # The session's input settings: the core's ConfigureListening sets them as the session starts, before any
        # audio, and again after each session.update.
        self.audio = AudioInput()
        self.decoder = InputDecoder()
        self.head_start = head_start
        self.session_id = session_id  # for the log
        self.request_id = request_id
        self.buffer = InputAudioBuffer()
        # A runtime given an ASR of its own (the voice tests) has loaded no VAD file: faster-whisper's, then.
        vad_model = runtime.vad_models.get("narrowband" if narrowband else "wideband") or silero_vad_path()
        self.vad = StreamingVad(SileroVad(vad_model), self._vad_settings())
        self.turn: UserTurn | None = None
        self._committed: dict[str, CommittedTurn] = {}
        self._queue: asyncio.Queue[np.ndarray] = asyncio.Queue()
        self._queued_samples = 0  # appended but not yet taken in by the processing task
        self._jobs: set[asyncio.Task[Any]] = set()
        self.noise = NoiseStage(runtime.denoise_executor)  # audio.input.noise_reduction
        self.judges = TurnJudges(runtime)  # semantic_vad's (and, if asked, server_vad's) end of turn
        # A reply is held by speech over it (HoldPlayout): no partial transcripts meanwhile, so the speculative one
        # that decides it has the cores to itself.
        self.partials_held = False
        self._task: asyncio.Task[None] | None = asyncio.create_task(self._run(), name=f"voice {session_id}")

    # -- configuration ----------------------------------------------------------------------

    def _vad_settings(self, silence_ms: int | None = None) -> VadSettings:
        """`silence_ms`: semantic_vad's wait for the silence running now; by default its longest."""
        detection = self.audio.turn_detection or TurnDetection()
        if isinstance(detection, SemanticVad):
            silence_ms = silence_ms if silence_ms is not None else SEMANTIC_WAITS_MS[detection.eagerness][1]
        elif silence_ms is None:
            silence_ms = detection.silence_duration_ms
        return VadSettings(
            threshold=min(max(detection.threshold, 0.05), 0.95),
            prefix_padding_ms=detection.prefix_padding_ms,
            silence_duration_ms=silence_ms,
            min_speech_ms=self.settings.min_barge_in_speech_ms,
        )

    def listen(self, audio: AudioInput) -> None:
        """The core's ConfigureListening."""
        self.audio = audio
        self.vad.detector.settings = self._vad_settings()

    # -- input --------------------------------------------------------------------------------

    def append_encoded(self, audio_b64: str) -> None:
        """input_audio_buffer.append: base64 audio in the session's input format."""
        self.append(self.decoder.decode(audio_b64, self.audio.format.type))

    def append(self, chunk: AudioChunk) -> None:
        """Queue 16 kHz audio; cheap, so transports can call it for every 20 ms frame."""
        if self.audio.turn_detection is None:
            cap = self.settings.max_input_audio_seconds * 1000
            queued_ms = self.buffer.index_to_ms(self._queued_samples)
            if self.buffer.held_ms + queued_ms + chunk.duration_ms > cap:
                raise ApiError(
                    "input_audio_buffer_full",
                    f"The input audio buffer holds at most {cap / 1000:.0f} s; commit or clear it.",
                )
        self._queued_samples += chunk.samples
        self._queue.put_nowait(chunk.pcm)

    async def commit(self) -> None:
        """input_audio_buffer.commit: everything buffered becomes a user item (manual turns)."""
        await self._drain_queue()
        turn = self.turn
        start = turn.start if turn is not None else self.buffer.start
        if self.buffer.end - start <= 0:
            raise ApiError("input_audio_buffer_commit_empty", "The input audio buffer is empty: nothing to commit.")
        item_id = turn.item_id if turn is not None else new_id("item")
        self._drop_turn()
        self.vad.reset(self.buffer.index_to_ms(self.buffer.end))
        marks = TurnMarks()
        marks.mark("speech_stopped")
        self._committed[item_id] = CommittedTurn(self.buffer.slice(start, self.buffer.end), marks, ready=[])
        self.buffer.clear()
        try:
            self.feed(AudioCommitted(item_id))
        except ApiError:
            self._committed.pop(item_id, None)
            raise

    def clear(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()
        self._queued_samples = 0
        self._drop_turn()
        self.buffer.clear()
        self.vad.reset(self.buffer.index_to_ms(self.buffer.end))
        self.feed(AudioCleared())

    async def close(self) -> None:
        self._drop_turn()
        for item_id in list(self._committed):
            self.drop_turn(item_id)
        tasks: list[asyncio.Task[Any]] = [*self._jobs, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        # A cancelled task keeps its CancelledError, whose traceback holds the task's frame and so
        # this pipeline: let the tasks go, or that cycle keeps the pipeline (and its session) alive.
        self._jobs.clear()
        self._task = None
        self.noise.close()

    async def _drain_queue(self) -> None:
        """Wait until the processing task has taken in the audio already queued."""
        await self._queue.join()

    # -- processing -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            pieces = [await self._queue.get()]
            while not self._queue.empty():
                pieces.append(self._queue.get_nowait())
            pcm = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            self._queued_samples -= len(pcm)
            pcm = await self.noise.process(pcm, self.audio.noise_reduction)
            self.buffer.append(pcm)
            try:
                await self._detect(pcm)
            finally:
                # Only now: a commit waits for the VAD to have heard what came before it (_drain_queue).
                for _ in pieces:
                    self._queue.task_done()

    async def _detect(self, pcm: np.ndarray) -> None:
        if self.audio.turn_detection is None:
            return
        try:
            events = await asyncio.get_running_loop().run_in_executor(
                self.runtime.vad_executor, self._vad_process, AudioChunk(pcm, RATE))
        except Exception:
            log.exception("VAD failed in session %s", self.session_id)
            return
        for event in events:
            await self._on_vad(event)
        await self._after_audio()

    def _vad_process(self, chunk: AudioChunk) -> list[VadEvent]:
        """On the VAD's worker thread; its time is charged to the VAD (not declared busy: it never makes the
        LLM engine give up a core, being short and constant)."""
        started = time.perf_counter()
        try:
            return self.vad.process(chunk)
        finally:
            charge("vad", time.perf_counter() - started)

    async def _on_vad(self, event: VadEvent) -> None:
        if isinstance(event, VadSpeechStarted):
            self.vad.detector.settings = self._vad_settings()  # semantic_vad: a new turn starts unjudged
            self.turn = UserTurn(item_id=new_id("item"), start=self.buffer.ms_to_index(event.padded_start_ms))
            self.feed(SpeechBegan(self.turn.item_id, event.audio_start_ms))
            await self.settle()  # a barge-in: the reply has ended before more audio is judged
        elif isinstance(event, VadSpeechStopped) and self.turn is not None:
            turn = self.turn
            self.turn = None
            marks = TurnMarks()
            marks.mark("speech_stopped")
            end = min(self.buffer.ms_to_index(event.audio_end_ms + ASR_TAIL_MS), self.buffer.end)
            ready = turn.covering(self.buffer.ms_to_index(event.audio_end_ms + ASR_COVER_MS))
            for _, job, _ in turn.jobs:
                if job not in ready:
                    job.cancel()
            self._committed[turn.item_id] = CommittedTurn(self.buffer.slice(turn.start, end), marks, ready,
                                                          preemption=turn.preemption)
            turn.preemption = None
            # The core commits it (Transcribe), or drops it when the conversation is full (DropTurn).
            self.feed(SpeechEnded(turn.item_id, event.audio_end_ms))

    async def _after_audio(self) -> None:
        turn = self.turn
        if turn is None:
            self.buffer.discard_before(self.buffer.end - self.buffer.ms_to_index(IDLE_KEEP_MS))
        # The core's clock tick: a barge-in the echo guard deferred, or the idle timeout.
        voiced_ms = self.vad.detector.voiced_ms if turn is not None else 0.0
        self.feed(AudioProcessed(round(self.buffer.index_to_ms(self.buffer.end)), turn_voiced_ms=voiced_ms))
        await self.settle()
        if turn is None or self.turn is not turn:
            return
        speech = self.vad.last_probability >= self.vad.detector.settings.threshold
        silence_started = self.vad.detector.silence_started_ms
        # The core starts the speculative final transcript (StartSpeculation) or discards it (DiscardSpeculation).
        self.feed(SilenceHeard(
            turn.item_id,
            silence_ms=self.vad.position_ms - silence_started if silence_started is not None else None,
            speech=speech,
            covered=bool(turn.covering(self.buffer.end - self.buffer.ms_to_index(ASR_COVER_MS))),
        ))
        if (
            turn.partial_task is None
            and not self.partials_held
            and speech
            and now() - turn.last_partial_at >= PARTIAL_INTERVAL_S
            and voiced_ms - turn.voiced_at_last_partial >= PARTIAL_VOICED_MS
        ):
            turn.last_partial_at, turn.voiced_at_last_partial = now(), voiced_ms
            job = self._spawn(self._transcribe(self.buffer.slice(turn.start, self.buffer.end), final=False))
            assert self.runtime.asr is not None
            turn.jobs.append((self.buffer.end, job, self.runtime.asr.partials_serve_as_finals))
            turn.partial_task = self._spawn(self._partial(turn, job))

    def start_speculation(self, item_id: str, *, judge_end: bool, preempt: ReplyContext | None) -> None:
        """The core's StartSpeculation: transcribe the open turn now, so the transcript is ready if it ends in
        this silence; from that transcript, its reply ahead (`preempt`) and semantic_vad's end judge."""
        turn = self.turn
        if turn is None or turn.item_id != item_id:
            return
        turn.speculative = self._spawn(self._transcribe(self.buffer.slice(turn.start, self.buffer.end), final=True,
                                                        work="asr_speculative"))
        turn.jobs.append((self.buffer.end, turn.speculative, True))
        self._spawn(self._speculated(turn, turn.speculative))
        if preempt:
            turn.preemption = self._spawn(self.head_start.preempt(turn.item_id, preempt, turn.speculative, self._spawn))
        if judge_end:
            turn.end_judge = self._spawn(self._judge_end(turn, turn.speculative))

    async def _speculated(self, turn: UserTurn, job: asyncio.Task[Transcript | None]) -> None:
        """The speculative transcript's words go to the core (over a held reply they decide it), unless the user
        went on speaking first (DiscardSpeculation)."""
        await asyncio.wait([job])
        if job.cancelled() or job.exception() is not None or turn.speculative is not job:
            return
        transcript = job.result()
        if transcript is not None:
            self.feed(TranscriptSpeculated(turn.item_id, transcript.text, transcript.avg_logprob))

    def discard_speculation(self, item_id: str) -> None:
        """The core's DiscardSpeculation: the user went on speaking."""
        turn = self.turn
        if turn is None or turn.item_id != item_id or turn.speculative is None:
            return
        turn.speculative.cancel()
        turn.speculative = None
        self._discard_preemption(turn)
        if turn.end_judge is not None:
            turn.end_judge.cancel()
            turn.end_judge = None
            self.vad.detector.settings = self._vad_settings()  # the next silence is judged afresh

    async def _judge_end(self, turn: UserTurn, speculative: asyncio.Task[Transcript | None]) -> None:
        """The judges of whether the turn is over, side by side: the audio model on the turn's audio so far, and
        the LLM on its words once they are transcribed. The core sets how long this silence must last from both
        (it may already have lasted that long); a judge that is not there or fails counts as absent."""
        audio = AudioChunk(self.buffer.slice(turn.start, self.buffer.end), RATE).to_float32()
        judged = await self.judges.judge(audio, speculative)
        if self.turn is turn and self.vad.detector.silence_started_ms is not None and (judged.audio, judged.text) != (None, None):
            self.feed(EndOfTurnJudged(turn.item_id, audio=judged.audio, text=judged.text, words_sure=judged.words_sure))

    def set_silence(self, item_id: str, silence_ms: int) -> None:
        """The core's SetSilence: the silence running now ends the turn after `silence_ms`."""
        if self.turn is not None and self.turn.item_id == item_id:
            log.debug("session %s: the silence ends the turn after %d ms", self.session_id, silence_ms)
            self.vad.detector.settings = self._vad_settings(silence_ms)

    # -- transcription ------------------------------------------------------------------------

    async def _transcribe(self, audio: np.ndarray, *, final: bool, work: str | None = None) -> Transcript | None:
        assert self.runtime.asr is not None
        pcm = AudioChunk(audio, RATE).to_float32()
        settings = self.audio.transcription
        transcript = await self.runtime.asr.transcribe(
            pcm, final=final, prompt=settings.prompt if settings else None, stream=self.session_id, work=work,
            language=settings.language if settings else None)  # the session's (one the model has: session_config)
        if transcript is not None:
            metrics.ASR_CALL_SECONDS.labels("final" if final else "partial").observe(transcript.seconds)
            log.debug("session %s: %s transcript of %.0f ms: waited %.3f s, ran %.3f s", self.session_id,
                      "final" if final else "partial", transcript.audio_ms, transcript.waited_seconds, transcript.seconds)
        return transcript

    async def _partial(self, turn: UserTurn, job: asyncio.Task[Transcript | None]) -> None:
        try:
            transcript = await asyncio.shield(job)  # the job may outlive this task: it can serve as the final
        finally:
            turn.partial_task = None
        if transcript is not None:
            self.feed(TranscriptPartial(turn.item_id, transcript.text))

    def transcribe(self, item_id: str) -> None:
        """The core's Transcribe: the committed turn's final transcript, then TurnReady."""
        turn = self._committed[item_id]
        job = self._spawn(self._transcribe_committed(item_id, turn))
        # Whatever ends the job, a response.create waiting for this transcript is not left waiting.
        job.add_done_callback(lambda _: self.feed(TranscriptionAbandoned(item_id)))

    async def _transcribe_committed(self, item_id: str, turn: CommittedTurn) -> None:
        try:
            transcript = await self._final_transcript(turn.audio, turn.ready)
        except Exception as exc:  # the model failed: the item stays without words, the session goes on
            log.exception("session %s: transcribing item %s failed", self.session_id, item_id)
            reason = f"Transcribing the audio failed: {str(exc) or type(exc).__name__}"
            self.feed(TranscriptFailed(item_id, ApiError("transcription_failed", reason, type="server_error")))
            return
        text = transcript.text if transcript is not None else ""
        try:  # the policy, before the model hears it: a redacted transcript, or none at all
            text = screen_text(self.runtime.safety, text, what="transcript", param=None)
        except ApiError as refused:
            self.feed(TranscriptFailed(item_id, refused, refused=True))
            return
        turn.marks.mark("transcript_final")
        avg_logprob = transcript.avg_logprob if transcript is not None else None
        self.feed(TranscriptFinal(item_id, text, len(turn.audio) / RATE, avg_logprob=avg_logprob))
        log_event("realtime.transcription.completed", session_id=self.session_id, request_id=self.request_id,
                  item_id=item_id, audio_s=round(len(turn.audio) / RATE, 3), words=len(text.split()),
                  content={"transcript": text})
        # Its reply generated ahead, if one started, before the core decides whether the turn gets a reply.
        preemption, turn.preemption = turn.preemption, None
        turn.head_start = await self.head_start.take(preemption)
        self.feed(TurnReady(item_id))

    async def _final_transcript(self, audio: np.ndarray, ready: list[asyncio.Task[Transcript | None]]) -> Transcript | None:
        for job in ready:  # a superseded partial resolves to None: try the next one
            transcript = None
            with contextlib.suppress(asyncio.CancelledError):
                transcript = await job
            if transcript is not None:
                return transcript
        return await self._transcribe(audio, final=True)

    def take_turn(self, item_id: str) -> tuple[TurnMarks, Preemption | None]:
        """The core's CreateResponse for a turn: its latency marks and its reply generated ahead (the response owns it)."""
        turn = self._committed.pop(item_id, None)
        return (turn.marks, turn.head_start) if turn is not None else (TurnMarks(), None)

    def drop_turn(self, item_id: str) -> None:
        """The core's DropTurn: the turn gets no reply, so what was made ahead for it goes."""
        turn = self._committed.pop(item_id, None)
        if turn is None:
            return
        if turn.preemption is not None:
            self.head_start.discard(turn.preemption)
        if turn.head_start is not None:
            turn.head_start.cancel()

    # -- head start ------------------------------------------------------------------------------

    def prefill_draft(self, context: ReplyContext, user_text: str) -> None:
        """The core's PrefillDraft (see head_start.py)."""
        if (prefill := self.head_start.prefill_draft(context, user_text)) is not None:
            self._spawn(prefill)

    def _discard_preemption(self, turn: UserTurn) -> None:
        task, turn.preemption = turn.preemption, None
        if task is not None:
            self.head_start.discard(task)

    # -- helpers ----------------------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine)
        self._jobs.add(task)
        task.add_done_callback(self._job_done)
        return task

    def _job_done(self, task: asyncio.Task[Any]) -> None:
        self._jobs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("voice job failed in session %s", self.session_id, exc_info=task.exception())

    def _drop_turn(self) -> None:
        turn, self.turn = self.turn, None
        if turn is not None:
            for _, job, _ in turn.jobs:
                job.cancel()
            self._discard_preemption(turn)

