"""Text to speech with Piper on a worker thread of its own, one sentence chunk per thread hop.

Advancing Piper's blocking generator one chunk per hop lets a cancelled response stop between
chunks: the rest of the text is never synthesized and the worker is free for the next reply.

Hops have a priority: live sessions' speech (LIVE) always runs before queued background hops
(BACKGROUND: POST /v1/audio/speech), so such a request delays a live reply by one hop at most,
the one the worker is running when the reply's hop arrives. Live hops run earliest deadline first:
a hop's deadline is when its audio must start playing. A reply's first clause is due at once (its user
hears nothing yet); a later clause is due when the audio already sent for its reply has played out.
So with several sessions speaking, one session's first clause no longer waits behind the rest of
another's reply, which has seconds of audio queued at the listener (FIFO did: at 8 sessions a reply's
first audio came 0.38 s (p50) to 1.4 s (p95) after its first clause, of which Piper's own time is
0.06-0.33 s).

The worker has `workers` threads (2 by default) taking hops from that one queue: at 8 sessions on 2
cores, Piper's work (0.8 core-seconds a turn) kept a single thread 85% busy while the process used 61%
of the cores, and the first clauses queued behind it. onnxruntime runs one session from several threads
at once; espeak-ng, which turns text into phonemes, is one global state, so that step is serialized.

One default voice (live sessions speak with it; a second onnxruntime session of it serves first
clauses) and any number of other installed voices, each on one onnxruntime session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from inference.cpu import using_cores

_PHONEMIZER = threading.Lock()  # espeak-ng keeps one global state: one text at a time, whichever worker asks

# Piper starts every sentence with 30-60 ms of near silence. A reply's first words go out without it
# (the user is waiting), keeping a few ms so that the first sound does not start abruptly.
LEAD_IN_LEVEL = 100  # int16 RMS of a 5 ms frame below which it is silence (about -50 dBFS)
LEAD_IN_KEPT_MS = 10


def trim_lead_in(pcm: np.ndarray, rate: int) -> np.ndarray:
    """`pcm` from LEAD_IN_KEPT_MS before its first non-silent 5 ms frame (all of it if none is)."""
    frame = rate // 200
    count = len(pcm) // frame
    if count == 0:
        return pcm
    levels = np.sqrt(np.mean(pcm[: count * frame].astype(np.float64).reshape(count, frame) ** 2, axis=1))
    loud = np.flatnonzero(levels > LEAD_IN_LEVEL)
    if loud.size == 0:
        return pcm
    return pcm[max(0, int(loud[0]) * frame - rate * LEAD_IN_KEPT_MS // 1000) :]


Priority = Literal["live", "background"]
_RANKS: dict[Priority, int] = {"live": 0, "background": 1}


@dataclass(order=True)
class _Hop:
    rank: int
    deadline: float
    seq: int
    call: Callable[[], Any] = field(compare=False)
    future: Future[Any] = field(compare=False)


class PriorityWorker:
    """`threads` threads that run submitted calls from one queue: the lowest rank first, the earliest deadline
    first within a rank (time.monotonic() seconds; None: due now), FIFO among equal deadlines."""

    def __init__(self, name: str, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"a worker needs at least one thread, not {threads}")
        self._queue: list[_Hop] = []
        self._seq = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._running = 0
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: Priority, call: Callable[[], Any], deadline: float | None = None) -> Future[Any]:
        future: Future[Any] = Future()
        due = time.monotonic() if deadline is None else deadline
        with self._ready:
            if self._closed:
                raise RuntimeError("the TTS worker is closed")
            heapq.heappush(self._queue, _Hop(_RANKS[priority], due, next(self._seq), call, future))
            self._ready.notify()
        return future

    def others_busy(self) -> int:
        """Hops running besides the caller's (called from a hop) and live hops queued."""
        with self._ready:
            return self._running - 1 + sum(1 for hop in self._queue if hop.rank == 0)

    def overdue(self) -> bool:
        """Whether a live hop whose audio is due by now waits in the queue (a first clause always is)."""
        with self._ready:
            return bool(self._queue) and self._queue[0].rank == 0 and self._queue[0].deadline <= time.monotonic()

    def _loop(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                hop = heapq.heappop(self._queue)
                if not hop.future.set_running_or_notify_cancel():
                    continue
                self._running += 1
            try:
                hop.future.set_result(hop.call())
            except BaseException as exc:  # delivered to whoever awaits the hop
                hop.future.set_exception(exc)
            finally:
                with self._ready:
                    self._running -= 1

    def shutdown(self) -> None:
        """Queued hops are cancelled; those running finish in the background."""
        with self._ready:
            self._closed = True
            pending, self._queue = self._queue, []
            self._ready.notify_all()
        for hop in pending:
            hop.future.cancel()


@dataclass(frozen=True)
class _Voice:
    piper: Any  # piper.PiperVoice on its own onnxruntime session
    threads: int  # the session's intra-op threads: the cores a synthesis keeps busy
    exclusive: bool  # the LLM engine waits while it synthesizes (inference/cpu.py)


class TtsEngine:
    def __init__(
        self,
        voice: object,
        *,
        volume: float,
        load_seconds: float,
        threads: int = 1,
        first_clause_voice: object | None = None,
        first_clause_threads: int = 1,
        variation: bool = True,
        voice_name: str = "default",
        other_voices: dict[str, object] | None = None,
        device: Literal["cpu", "cuda"] = "cpu",
        workers: int = 1,
    ) -> None:
        from piper import SynthesisConfig

        self.device = device  # where the voices' onnxruntime sessions run

        self._voice = _Voice(voice, threads, exclusive=False)
        self.voice_name = voice_name
        # The other installed voices by name (POST /v1/audio/speech), on `threads` threads each.
        self._others = {name: _Voice(other, threads, exclusive=False) for name, other in (other_voices or {}).items()}
        # The same voice on more threads, for a reply's first clause (see synthesize).
        self._first_clause_voice = (
            _Voice(first_clause_voice, first_clause_threads, exclusive=True) if first_clause_voice is not None else self._voice
        )
        self._config = SynthesisConfig(normalize_audio=True, volume=volume)
        if not variation:  # Piper samples noise for every take; without it a text always sounds the same
            self._config.noise_scale = 0.0
            self._config.noise_w_scale = 0.0
        self.sample_rate: int = voice.config.sample_rate  # type: ignore[attr-defined]
        self.load_seconds = load_seconds
        self.workers = workers
        self._worker = PriorityWorker("tts", workers)

    def speech_overdue(self) -> bool:
        """Whether a live session's speech waits for the worker past its deadline: a listener hears silence."""
        return self._worker.overdue()

    @property
    def voice_names(self) -> list[str]:
        """The installed voices, the default first."""
        return [self.voice_name, *self._others]

    def sample_rate_of(self, voice: str | None) -> int:
        return self._pick(voice, first_clause=False).piper.config.sample_rate  # type: ignore[no-any-return]

    def language_of(self, voice: str | None) -> str:
        """The voice's espeak-ng language, which its phonemes are made for ("en-us")."""
        return self._pick(voice, first_clause=False).piper.config.espeak_voice  # type: ignore[no-any-return]

    def _pick(self, voice: str | None, *, first_clause: bool) -> _Voice:
        if voice is None or voice == self.voice_name:
            return self._first_clause_voice if first_clause else self._voice
        if voice not in self._others:
            raise KeyError(f"no voice named {voice!r}: {', '.join(self.voice_names)}")
        return self._others[voice]

    @classmethod
    def load(
        cls,
        model_path: Path | str,
        config_path: Path | str | None = None,
        threads: int = 1,
        *,
        first_clause_threads: int = 1,
        volume: float = 0.9,
        warmup: bool = True,
        variation: bool = True,
        voice_name: str = "default",
        other_voices: Sequence[tuple[str, Path]] = (),
        device: Literal["cpu", "cuda"] = "cpu",
        workers: int = 1,
    ) -> TtsEngine:
        """Blocking. volume < 1 leaves headroom: Piper peaks every sentence at full scale and resampling overshoots.

        `first_clause_threads` > `threads` loads a second onnxruntime session of the voice for first
        clauses (about 100 MB more for a medium voice, measured). `variation=False`: the same text always gives
        the same audio (test and benchmark speech: a run does not depend on the take). `other_voices`:
        more installed voices (name, .onnx with its .onnx.json beside it), for POST /v1/audio/speech.
        `device` "cuda": onnxruntime's CUDA provider (onnxruntime-gpu), where threads do not matter: no
        first-clause session. `workers`: the threads that synthesize side by side (see the module's docstring)."""
        started = time.perf_counter()
        config = _config(Path(config_path) if config_path else Path(f"{model_path}.json"))
        voice = _piper(model_path, config, threads, device)
        first_clause_voice = None
        if first_clause_threads > threads and device == "cpu":
            first_clause_voice = _piper(model_path, config, first_clause_threads, device)
        others = {name: _piper(path, _config(Path(f"{path}.json")), threads, device) for name, path in other_voices}
        engine = cls(
            voice,
            volume=volume,
            load_seconds=0.0,
            threads=threads,
            first_clause_voice=first_clause_voice,
            first_clause_threads=first_clause_threads,
            variation=variation,
            voice_name=voice_name,
            other_voices=dict(others),
            device=device,
            workers=workers,
        )
        if warmup:
            engine.synthesize_blocking("Hello.")  # also loads espeak-ng's data once
            if first_clause_voice is not None:
                engine.synthesize_blocking("Hello.", first_clause=True)
            for name in others:
                engine.synthesize_blocking("Hello.", voice=name)
        engine.load_seconds = time.perf_counter() - started
        return engine

    def _chunks(
        self, text: str, first_clause: bool, speed: float, voice_name: str | None = None,
        on_phonemes: Callable[[int], None] | None = None, work: str = "tts",
    ) -> Generator[np.ndarray, None, None]:
        # Runs on the worker at the first hop. Every core for a first clause only while no other speech runs
        # or waits: else the LLM stalls for it and the others wait longer (the cores do more work on one).
        voice = self._pick(voice_name, first_clause=first_clause and not self._worker.others_busy())
        config = self._config
        if speed != 1.0:  # Piper's length scale stretches phoneme durations: speed 2 halves it
            config = dataclasses.replace(config, length_scale=(voice.piper.config.length_scale or 1.0) / speed)
        piper = voice.piper
        with _PHONEMIZER:
            sentences = piper.phonemize(text)
        lead_in = first_clause
        for phonemes in sentences:
            if not phonemes:
                continue
            ids = piper.phonemes_to_ids(phonemes)
            with using_cores(voice.threads, exclusive=voice.exclusive, work=work):
                audio = piper.phoneme_ids_to_audio(ids, config)
            if on_phonemes is not None:
                on_phonemes(len(ids))
            pcm = _to_int16(audio, config)
            if lead_in:
                pcm, lead_in = trim_lead_in(pcm, piper.config.sample_rate), False
            yield pcm

    async def synthesize(
        self,
        text: str,
        *,
        first_clause: bool = False,
        speed: float = 1.0,
        voice: str | None = None,
        priority: Priority = "live",
        on_phonemes: Callable[[int], None] | None = None,
        deadline: float | None = None,
    ) -> AsyncGenerator[np.ndarray, None]:
        """int16 mono PCM at the voice's rate (sample_rate for the default voice), one Piper sentence per
        item; `speed` 2.0 speaks twice as fast. `voice`: an installed voice's name (None: the default).
        `priority`: "background" hops wait while any live hop is queued.

        `first_clause`: the reply's first words, which the user waits for in silence. They start
        without Piper's lead-in silence, and with a first-clause voice loaded they are synthesized
        on its threads while the LLM engine waits (inference/cpu.py): the rest of the reply has the
        whole clause's playing time to catch up. Not while other live speech waits for the worker:
        then they go on one thread like the rest.

        `on_phonemes`: called on the worker with each sentence's count of phoneme ids, Piper's input tokens.

        `deadline`: when the audio must start playing (time.monotonic(); None: now, as for a first clause).
        The worker runs live hops earliest deadline first; each later sentence of the text is due when the
        one before it has played, from its deadline or from when it was made, whichever is later."""
        work = "tts_file" if priority == "background" else "tts_first_clause" if first_clause else "tts"
        chunks = self._chunks(text, first_clause, speed, voice, on_phonemes, work)
        rate = self.sample_rate_of(voice)
        due = deadline
        hop: Future[Any] | None = None
        try:
            while True:
                hop = self._worker.submit(priority, lambda: next(chunks, None), due)
                pcm = await asyncio.wrap_future(hop)
                if pcm is None:
                    return
                made = time.monotonic()
                due = max(due, made) if due is not None else made
                due += len(pcm) / rate
                yield pcm
        finally:
            # A hop may still be running (on any of the worker's threads): the generator is closed on the worker
            # once that hop is over, on no one's loop.
            def close(_: object = None) -> None:
                try:
                    self._worker.submit("live", chunks.close)
                except RuntimeError:
                    pass  # closed engine: the generator is simply dropped

            if hop is not None:
                hop.add_done_callback(close)
            else:
                close()

    def synthesize_blocking(
        self, text: str, *, first_clause: bool = False, speed: float = 1.0, voice: str | None = None
    ) -> np.ndarray:
        """Whole utterance on the calling thread, for tools and tests."""
        parts = list(self._chunks(text, first_clause, speed, voice))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        self._worker.shutdown()


def _to_int16(audio: np.ndarray, config: Any) -> np.ndarray:
    """A sentence's float audio as PiperVoice.synthesize gives it (normalized to its peak, at the volume, clipped),
    in int16."""
    if config.normalize_audio:
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        audio = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
    if config.volume != 1.0:
        audio = audio * config.volume
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    return np.clip(audio * 32767.0, -32767.0, 32767.0).astype(np.int16)


def _config(path: Path) -> Any:
    from piper.config import PiperConfig

    return PiperConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))


def _piper(model_path: Path | str, config: Any, threads: int, device: Literal["cpu", "cuda"]) -> Any:
    from piper import PiperVoice

    return PiperVoice(session=_session(model_path, threads, device), config=config)


def _session(model_path: Path | str, threads: int, device: Literal["cpu", "cuda"]) -> Any:
    """An onnxruntime session on `threads` threads (PiperVoice.load would give it every core), or on CUDA.

    Its workers sleep between runs instead of spinning: a spinning worker would hold a core the
    LLM engine is about to use."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # On CUDA with PiperVoice.load(use_cuda=True)'s option: the exhaustive cuDNN search costs seconds a new length.
    providers: list[Any] = ([("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})]
                            if device == "cuda" else ["CPUExecutionProvider"])
    session = onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=providers)
    if device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":  # it fell back to the CPU
        raise RuntimeError("onnxruntime could not start its CUDA provider for Piper (its log says why): "
                           "run with --tts-device cpu")
    return session
