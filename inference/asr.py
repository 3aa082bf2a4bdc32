"""Speech to text with faster-whisper on a worker thread of its own, partial and final transcripts.

A short window: Whisper encodes 30 s of (padded) audio whatever the utterance's length, and on this
CPU that encoder pass is most of a call (tiny.en, int8: 0.30 s of 0.40-0.50 s for a 2 s question).
Utterances that fit are encoded in a `window_s` window instead (15 s: 0.12-0.22 s a call, the same
text on the test questions). Below ~15 s the decoder starts repeating itself; a transcript that runs
to its token budget, repeats a sentence back to back or compresses like a loop is decoded again over
the full 30 s, so the window does not cost correctness. Audio longer than the window goes through
faster-whisper's own long-form transcription.

Partial transcripts take a shorter window still (`partial_window_s`, 10 s), because a partial only shows the
words so far and is made several times a turn. On the multi-voice set cut mid-speech, as a partial hears it
(`python -m benchmarks.asr_models --partials 0.6`; AMD EPYC Zen 3, one thread), a call cost 0.33
core-seconds on 10 s against 0.44 on 15 s, its words 10% different from the 15 s decode's and none
degenerate; 8 s cost 0.29 but differed by 15% and looped on 2 of 286, 6 s on 6. A partial that looks
degenerate is dropped, not decoded again; one on a shorter window than the finals' never stands in for the
final transcript.

Scheduling, because a call costs 0.1-0.5 s on CPU whatever the audio length:
- finals run before any queued partial, and with `workers` above 1 beside them: the first worker takes
  every kind of job, the others take finals only (each on a model replica of its own), so a final waits
  neither for a partial already running nor for another session's final;
- a queued partial of a stream is replaced by a newer one of the same stream (the old one
  resolves to None): a partial is only worth having while it is the latest;
- background work (POST /v1/audio/transcriptions: `transcribe_long`) runs last, one 30 s window of
  the file per hop, so a live turn waits for one window's decode at most;
- partials are optional work, dropped (resolved to None, as a superseded one is; `partials_skipped`
  counts them) when they are due to run but the partials of the last seconds already took their share
  of a core (`partial_budget`: 8 sessions speaking at once would ask for a whole core, a 0.1 s call
  every 0.9 s each),
  or while `partials_yield_to()` says that work a user is waiting for is queued elsewhere (a reply's
  first clause or an overdue clause in Piper, a reply waiting for its first token in the LLM): under
  load the cores go to the critical path first, and each session's partials come less often.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from inference.cpu import using_cores
from inference.transcript_checks import looks_degenerate

log = logging.getLogger(__name__)

ASR_RATE = 16000
FULL_WINDOW_S = 30.0  # Whisper's own input length
DEFAULT_WINDOW_S = 15.0
DEFAULT_PARTIAL_WINDOW_S = 10.0
DEFAULT_PARTIAL_BUDGET = 0.3  # of a core: one session's partials take ~0.12 (a 0.1 s call every 0.9 s of speech)
PARTIAL_BURST_S = 0.5  # core-seconds of partials that may run back to back after a quiet while
TOKENS_PER_SECOND = 8  # token budget of a windowed decode: speech runs at ~3-4 tokens a second
MAX_PROMPT_TOKENS = 223  # Whisper gives a prompt at most half of its 448-token context
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # Whisper's long-form decoding (and faster-whisper's default)


@dataclass(frozen=True)
class Transcript:
    text: str
    final: bool
    audio_ms: float  # length of the audio transcribed
    seconds: float  # time spent in the model
    waited_seconds: float  # time queued before the worker took it
    # Whisper's mean log-probability per token of the text (its end token included, as Whisper counts it): how
    # sure it is of the words. None: nothing was decoded (audio Whisper took for silence).
    avg_logprob: float | None


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class TranscriptSegment:
    """One segment of a long-form transcription, with Whisper's own measures of it."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word]


@dataclass(frozen=True)
class LongTranscription:
    language: str
    duration: float  # seconds of audio
    segments: AsyncGenerator[TranscriptSegment, None]  # decoded one window per worker hop as they are consumed


T = TypeVar("T")


def import_ctranslate2(threads: int) -> Any:
    """CTranslate2, with the copy of libgomp its wheel carries started at `threads` OpenMP threads.

    `cpu_threads` does not bound the OpenMP team of CTranslate2's kernels: with cpu_threads=1 on a 2-core
    CPU a tiny.en call of a 3 s question kept both cores busy (0.22 CPU-s a call for 0.12 s of wall time,
    measured) and ran no faster than on one (OMP_NUM_THREADS=1: 0.10-0.11 s for 0.10 CPU-s), taking a core
    from the LLM and Piper for nothing. libgomp reads OMP_NUM_THREADS once, when it loads, so the variable
    is set around the first import only and put back: torch's libgomp and the engine's kernels keep theirs.
    Once CTranslate2 is imported (by anything), this changes nothing."""
    if "ctranslate2" in sys.modules:
        return sys.modules["ctranslate2"]
    import torch  # noqa: F401  (its libgomp, which the LLM's kernels share, loads first, with the process's setting)

    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads))
    try:
        import ctranslate2
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before
    return ctranslate2


@dataclass(eq=False)
class _Call:
    """Background work: runs after every live final and partial."""

    call: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass(eq=False)
class _Job:
    audio: np.ndarray
    final: bool
    prompt: str | None
    stream: str
    work: str  # what its core-seconds are charged to (inference/cpu.py)
    language: str | None  # the session's, with a multilingual model (None: the model's own, detected if it has none)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Transcript | None]
    submitted: float = field(default_factory=time.perf_counter)


@functools.cache
def whisper_languages() -> frozenset[str]:
    """The language codes a multilingual Whisper decodes ("de", "fr", ...)."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return frozenset(_LANGUAGE_CODES)


class AsrEngine:
    def __init__(
        self,
        model: object,
        *,
        language: str | None,
        final_beam_size: int,
        load_seconds: float,
        window_s: float = DEFAULT_WINDOW_S,
        partial_window_s: float = DEFAULT_PARTIAL_WINDOW_S,
        threads: int = 1,
        device: Literal["cpu", "cuda"] = "cpu",
        compute_type: str = "int8",
        partial_budget: float = DEFAULT_PARTIAL_BUDGET,
        workers: int = 1,
    ) -> None:
        if not 1.0 <= window_s <= FULL_WINDOW_S:
            raise ValueError(f"window_s must be within 1..{FULL_WINDOW_S:.0f} s, not {window_s}")
        if not 1.0 <= partial_window_s <= FULL_WINDOW_S:
            raise ValueError(f"partial_window_s must be within 1..{FULL_WINDOW_S:.0f} s, not {partial_window_s}")
        if partial_budget <= 0:
            raise ValueError(f"partial_budget must be above 0 (a share of a core), not {partial_budget}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self._model = model  # faster_whisper.WhisperModel
        self.language = language
        self.final_beam_size = final_beam_size
        self.load_seconds = load_seconds
        self.window_s = window_s
        self.partial_window_s = min(partial_window_s, window_s)
        self.threads = threads  # CTranslate2's threads: the cores a transcription keeps busy
        self.device = device
        self.compute_type = compute_type  # CTranslate2's: int8 on a CPU, float16 on CUDA
        self.windowed_calls = 0
        self.full_window_retries = 0
        self.partials_skipped = 0
        self.partials_degenerate = 0
        # Whether work a user waits for is queued elsewhere (the runtime wires the TTS and LLM engines' probes).
        self.partials_yield_to: Callable[[], bool] | None = None
        # A token bucket of core-seconds: refilled at `partial_budget` a second, spent by each partial run.
        self.partial_budget = partial_budget
        self._partial_credit = PARTIAL_BURST_S
        self._credit_at = time.monotonic()
        self._tokenizers: dict[str, tuple[Any, list[int]]] = {}  # by language: its tokenizer, its suppressed tokens
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr")
        # The other workers, for finals only (see the module's docstring); None with one worker.
        self._finals_executor = (ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="asr-final")
                                 if workers > 1 else None)
        self._lock = threading.Lock()
        self._finals: deque[_Job] = deque()
        self._partials: dict[str, _Job] = {}  # insertion order = submission order
        self._background: deque[_Call] = deque()
        self._closed = False

    @property
    def multilingual(self) -> bool:
        """Whether the model knows languages besides English, and so can translate (a .en model cannot)."""
        return bool(self._model.model.is_multilingual)  # type: ignore[attr-defined]

    @property
    def partials_serve_as_finals(self) -> bool:
        """Whether a partial that covers the end of speech is decoded as the final would be, so may stand in for it."""
        return self.partial_window_s == self.window_s

    def stats(self) -> dict[str, float]:
        return {"windowed_calls": self.windowed_calls, "full_window_retries": self.full_window_retries,
                "partials_skipped": self.partials_skipped, "partials_degenerate": self.partials_degenerate}

    @classmethod
    def load(
        cls,
        path: Path | str,
        device: Literal["cpu", "cuda"] = "cpu",
        threads: int = 2,
        *,
        language: str | None = None,
        final_beam_size: int = 1,
        window_s: float = DEFAULT_WINDOW_S,
        partial_window_s: float = DEFAULT_PARTIAL_WINDOW_S,
        warmup: bool = True,
        partial_budget: float = DEFAULT_PARTIAL_BUDGET,
        workers: int = 1,
    ) -> AsrEngine:
        """Blocking: call it at start-up or in an executor. language None means "en" for .en models."""
        import_ctranslate2(threads)
        from inference.whisper_fallback import KeepingWhisperModel

        started = time.perf_counter()
        compute_type = "float16" if device == "cuda" else "int8"
        # A replica per worker: CTranslate2 runs one call at a time on each.
        model = KeepingWhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=threads,
                                    num_workers=workers)
        if language is None and not model.model.is_multilingual:
            language = "en"
        engine = cls(
            model, language=language, final_beam_size=final_beam_size, load_seconds=0.0, window_s=window_s,
            partial_window_s=partial_window_s, threads=threads,
            device=device, compute_type=compute_type, partial_budget=partial_budget, workers=workers,
        )
        if warmup:
            # The first call pays one-off allocations (~2x a warm call); take that hit at load, not in a turn.
            engine._run(np.zeros(ASR_RATE, dtype=np.float32), final=True, prompt=None, language=engine.language)
        engine.load_seconds = time.perf_counter() - started
        return engine

    async def transcribe(
        self, audio: np.ndarray, *, final: bool, prompt: str | None = None, stream: str = "",
        work: str | None = None, language: str | None = None,
    ) -> Transcript | None:
        """audio: float32 mono 16 kHz. None for a partial superseded before it ran, or a job still queued at close().
        `work`: what the call's core-seconds are charged to (default asr_final or asr_partial). `language`: the
        session's (a multilingual model decodes it without detecting one, on the short window); None: the model's."""
        if self._closed:
            raise RuntimeError("AsrEngine is closed")
        if audio.ndim != 1:
            raise ValueError(f"ASR takes mono audio, got shape {audio.shape}")
        loop = asyncio.get_running_loop()
        work = work or ("asr_final" if final else "asr_partial")
        job = _Job(np.asarray(audio, dtype=np.float32), final, prompt, stream, work, language or self.language, loop,
                   loop.create_future())
        with self._lock:
            if final:
                self._finals.append(job)
            else:
                old = self._partials.pop(stream, None)
                if old is not None:
                    self._resolve(old, None)
                self._partials[stream] = job
        self._executor.submit(self._run_next)
        if final and self._finals_executor is not None:
            self._finals_executor.submit(self._run_next, finals_only=True)  # whichever worker is free first
        try:
            return await job.future
        finally:
            # Cancelled while still queued: drop it so the worker never spends time on it.
            if job.future.cancelled():
                self._discard(job)

    def _discard(self, job: _Job) -> None:
        with self._lock:
            if job in self._finals:
                self._finals.remove(job)
            if self._partials.get(job.stream) is job:
                del self._partials[job.stream]

    def _take(self, finals_only: bool = False) -> _Job | _Call | None:
        with self._lock:
            if self._finals:
                return self._finals.popleft()
            if finals_only:
                return None
            if not self._partials:
                return self._background.popleft() if self._background else None
            partial = self._partials.pop(next(iter(self._partials)))
        over_budget = self.device == "cpu" and self._partial_credit_left() <= 0  # a GPU's time is not the cores'
        if over_budget or (self.partials_yield_to is not None and self.partials_yield_to()):
            self.partials_skipped += 1
            self._resolve(partial, None)
            return None
        return partial

    def _partial_credit_left(self) -> float:
        """The bucket's core-seconds now (the first worker's thread alone reads and spends it)."""
        now = time.monotonic()
        most = max(PARTIAL_BURST_S, self.partial_budget)  # a second's worth of a large budget
        self._partial_credit = min(most, self._partial_credit + (now - self._credit_at) * self.partial_budget)
        self._credit_at = now
        return self._partial_credit

    async def _in_background(self, call: Callable[[], T]) -> T:
        """Run `call` on the worker once no live job is queued."""
        if self._closed:
            raise RuntimeError("AsrEngine is closed")
        loop = asyncio.get_running_loop()
        job = _Call(call, loop, loop.create_future())
        with self._lock:
            self._background.append(job)
        self._executor.submit(self._run_next)
        try:
            return await job.future  # type: ignore[no-any-return]
        finally:
            if job.future.cancelled():
                with self._lock:
                    if job in self._background:
                        self._background.remove(job)

    async def transcribe_long(
        self,
        audio: np.ndarray,
        *,
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
        task: Literal["transcribe", "translate"] = "transcribe",
    ) -> LongTranscription:
        """A whole file (float32 mono 16 kHz, any length) with segment timestamps, at background priority.

        faster-whisper's long-form transcription, conditioned on the previous window's text; each hop of
        the worker decodes one 30 s window. `language` None: the model's own (detected if multilingual).
        `temperature` 0, as in OpenAI's API, falls back to higher temperatures where a window's output looks
        like a loop or unlikely (Whisper's own thresholds); another value samples at that temperature only.
        A window that fails at every temperature keeps its greedy decode where that one is likely and ends
        by itself (inference/whisper_fallback.py): speech is not dropped for sounding repetitive.
        `task` "translate": English text of speech in any language, which only a multilingual model does."""
        model: Any = self._model
        temperatures = FALLBACK_TEMPERATURES if temperature == 0.0 else (temperature,)

        def start() -> tuple[Iterator[Any], Any]:
            with using_cores(self.threads, work="asr_file"):
                return model.transcribe(  # type: ignore[no-any-return]
                    np.asarray(audio, dtype=np.float32), language=language or self.language, beam_size=self.final_beam_size,
                    best_of=1, temperature=temperatures, initial_prompt=prompt or None, word_timestamps=word_timestamps,
                    condition_on_previous_text=True, vad_filter=False, task=task,
                )

        segments, info = await self._in_background(start)
        return LongTranscription(info.language, float(info.duration), self._segments(segments))

    async def _segments(self, segments: Iterator[Any]) -> AsyncGenerator[TranscriptSegment, None]:
        def step() -> Any:
            with using_cores(self.threads, work="asr_file"):
                return next(segments, None)

        try:
            while (segment := await self._in_background(step)) is not None:
                words = [Word(w.word, float(w.start), float(w.end)) for w in (segment.words or [])]
                yield TranscriptSegment(
                    id=int(segment.id) - 1, seek=int(segment.seek), start=float(segment.start), end=float(segment.end),
                    text=segment.text, tokens=list(segment.tokens), temperature=float(segment.temperature or 0.0),
                    avg_logprob=float(segment.avg_logprob), compression_ratio=float(segment.compression_ratio),
                    no_speech_prob=float(segment.no_speech_prob), words=words,
                )
        finally:
            close = getattr(segments, "close", None)
            if close is not None:  # on the worker: a hop may still be running it
                with contextlib.suppress(RuntimeError):  # a closed engine: the generator is simply dropped
                    self._executor.submit(close)

    def _run_next(self, finals_only: bool = False) -> None:
        """Runs on a worker: one submit per job (a final's on each kind of worker), but superseded jobs and finals
        another worker took leave some calls with nothing to do."""
        job = self._take(finals_only)
        if job is None:
            return
        if isinstance(job, _Call):
            try:
                _deliver(job, _set_result, job.call())
            except Exception as exc:  # reaches the awaiting request, not the worker
                log.exception("ASR background work failed")
                _deliver(job, _set_exception, exc)
            return
        waited = time.perf_counter() - job.submitted
        try:
            with using_cores(self.threads, work=job.work):
                text, avg_logprob, seconds = self._run(job.audio, final=job.final, prompt=job.prompt,
                                                       language=job.language)
        except Exception as exc:  # the model failing must reach the awaiting session, not kill the worker
            log.exception("ASR failed")
            _deliver(job, _set_exception, exc)
            return
        if not job.final:
            self._partial_credit -= seconds * self.threads
        if text is None:  # a degenerate partial: dropped
            self.partials_degenerate += 1
            self._resolve(job, None)
            return
        audio_ms = 1000.0 * job.audio.shape[0] / ASR_RATE
        self._resolve(job, Transcript(text, job.final, audio_ms, seconds, waited, avg_logprob))

    @staticmethod
    def _resolve(job: _Job, result: Transcript | None) -> None:
        _deliver(job, _set_result, result)

    def _run(self, audio: np.ndarray, *, final: bool, prompt: str | None,
             language: str | None) -> tuple[str | None, float | None, float]:
        """(text, its average log-probability, seconds spent); text None: a partial on its own short window
        came out degenerate (a final is decoded again over 30 s instead)."""
        started = time.perf_counter()
        beam_size = self.final_beam_size if final else 1
        window_s = self.window_s
        if not final and audio.shape[0] <= self.partial_window_s * ASR_RATE:
            window_s = self.partial_window_s
        decoded = None
        if window_s < FULL_WINDOW_S and language is not None and audio.shape[0] <= window_s * ASR_RATE:
            self.windowed_calls += 1
            decoded = self._decode_window(audio, window_s, beam_size, prompt, language)
            if decoded is None and window_s < self.window_s:
                return None, None, time.perf_counter() - started
            if decoded is None:
                self.full_window_retries += 1
        text, avg_logprob = (decoded if decoded is not None
                             else self._transcribe_full(audio, beam_size, prompt, language))
        return text, avg_logprob, time.perf_counter() - started

    def _decode_window(self, audio: np.ndarray, window_s: float, beam_size: int, prompt: str | None,
                       language: str) -> tuple[str, float] | None:
        """One decode over a `window_s` window: its text and average log-probability; None when its output looks
        degenerate."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        model: Any = self._model
        if language not in self._tokenizers:
            made = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=language)
            self._tokenizers[language] = (made, get_suppressed_tokens(made, (-1,)))
        tokenizer, suppress = self._tokenizers[language]
        features = model.feature_extractor(audio)  # [n_mels, frames]; zero-padded like faster-whisper's segments
        frames = int(window_s * 100)
        features = np.pad(features, ((0, 0), (0, max(0, frames - features.shape[1]))))[:, :frames]
        tokens = list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]
        if prompt:  # Whisper's prompt format: previous text after <|startofprev|>, before the task tokens
            tokens = [tokenizer.sot_prev, *tokenizer.encode(" " + prompt.strip())[-MAX_PROMPT_TOKENS:], *tokens]
        budget = int(TOKENS_PER_SECOND * audio.shape[0] / ASR_RATE) + 16
        result = model.model.generate(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None], dtype=np.float32)),
            [tokens],
            beam_size=beam_size,
            max_length=budget + len(tokens),  # whether or not CTranslate2 counts the prompt in it
            suppress_blank=True,
            suppress_tokens=suppress,
            return_scores=True,
        )[0]
        ids = [i for i in result.sequences_ids[0] if i < tokenizer.eot]
        text = tokenizer.decode(ids).strip()
        if looks_degenerate(text, len(result.sequences_ids[0]), budget):
            return None
        # CTranslate2's score: the log-probabilities summed, the end token's included, over the text's token count
        # (length_penalty 1); the mean counts the end token too, as faster-whisper's avg_logprob does.
        length = len(result.sequences_ids[0])
        return text, float(result.scores[0]) * length / (length + 1)

    def _transcribe_full(self, audio: np.ndarray, beam_size: int, prompt: str | None,
                         language: str | None) -> tuple[str, float | None]:
        segments, _info = self._model.transcribe(  # type: ignore[attr-defined]
            audio,
            language=language,
            beam_size=beam_size,
            best_of=1,
            temperature=0.0,  # fallback re-decodes cost 1-2.6 s spikes on short audio
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,  # we run our own VAD
            initial_prompt=prompt or None,
        )
        # segments is lazy: decoding happens while it is consumed, so consume it here on the worker.
        decoded = list(segments)
        text = " ".join(segment.text.strip() for segment in decoded).strip()
        # Each segment's average, weighted by its tokens (and end token): the whole text's average.
        counted = sum(len(segment.tokens) + 1 for segment in decoded)
        if not counted:
            return text, None
        return text, sum(segment.avg_logprob * (len(segment.tokens) + 1) for segment in decoded) / counted

    def close(self) -> None:
        """Queued jobs resolve to None; the job running finishes in the background."""
        self._closed = True
        with self._lock:
            pending = list(self._finals) + list(self._partials.values())
            background = list(self._background)
            self._finals.clear()
            self._partials.clear()
            self._background.clear()
        for job in pending:
            self._resolve(job, None)
        for call in background:
            _deliver(call, _set_exception, RuntimeError("AsrEngine is closed"))
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._finals_executor is not None:
            self._finals_executor.shutdown(wait=False, cancel_futures=True)


def _deliver(job: _Job | _Call, setter: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
    try:
        job.loop.call_soon_threadsafe(setter, job.future, value)
    except RuntimeError:
        pass  # the loop is closed: nobody is waiting any more


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


_WORD_EDGES = "\"'.,!?;:()[]…-—"


class TranscriptStabilizer:
    """The words two successive partials agree on, from the start: safe to prefill into the LLM early.

    The prefix can shrink when a later partial revises an earlier word; callers that prefill
    must compare with what they already sent.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._previous: list[str] = []
        self.stable = ""

    def update(self, partial: str) -> str:
        words = partial.split()
        agreed = 0
        for old, new in zip(self._previous, words):
            if _norm(old) != _norm(new):
                break
            agreed += 1
        self._previous = words
        self.stable = " ".join(words[:agreed])
        return self.stable


def _norm(word: str) -> str:
    return word.strip(_WORD_EDGES).lower()
