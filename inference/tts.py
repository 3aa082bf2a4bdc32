"""Text to speech with Piper on a worker thread of its own, one sentence chunk per thread hop.

Advancing Piper's blocking generator one chunk per hop lets a cancelled response stop between
chunks: the rest of the text is never synthesized and the worker is free for the next reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.cpu import using_cores

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
    ) -> None:
        from piper import SynthesisConfig

        self._voice = _Voice(voice, threads, exclusive=False)
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts")

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
    ) -> TtsEngine:
        """Blocking. volume < 1 leaves headroom: Piper peaks every sentence at full scale and resampling overshoots.

        `first_clause_threads` > `threads` loads a second onnxruntime session of the voice for first
        clauses (about 100 MB more for a medium voice, measured). `variation=False`: the same text always gives
        the same audio (test and benchmark speech: a run does not depend on the take)."""
        from piper import PiperVoice
        from piper.config import PiperConfig

        started = time.perf_counter()
        config_file = Path(config_path) if config_path else Path(f"{model_path}.json")
        config = PiperConfig.from_dict(json.loads(config_file.read_text(encoding="utf-8")))
        voice = PiperVoice(session=_session(model_path, threads), config=config)
        first_clause_voice = None
        if first_clause_threads > threads:
            first_clause_voice = PiperVoice(session=_session(model_path, first_clause_threads), config=config)
        engine = cls(
            voice,
            volume=volume,
            load_seconds=0.0,
            threads=threads,
            first_clause_voice=first_clause_voice,
            first_clause_threads=first_clause_threads,
            variation=variation,
        )
        if warmup:
            engine.synthesize_blocking("Hello.")  # also loads espeak-ng's data once
            if first_clause_voice is not None:
                engine.synthesize_blocking("Hello.", first_clause=True)
        engine.load_seconds = time.perf_counter() - started
        return engine

    def _chunks(self, text: str, first_clause: bool, speed: float) -> Generator[np.ndarray, None, None]:
        voice = self._first_clause_voice if first_clause else self._voice
        config = self._config
        if speed != 1.0:  # Piper's length scale stretches phoneme durations: speed 2 halves it
            config = dataclasses.replace(config, length_scale=(voice.piper.config.length_scale or 1.0) / speed)
        sentences = iter(voice.piper.synthesize(text, syn_config=config))
        lead_in = first_clause
        while True:
            with using_cores(voice.threads, exclusive=voice.exclusive):  # the synthesis happens inside next()
                chunk = next(sentences, None)
            if chunk is None:
                return
            pcm = chunk.audio_int16_array
            if lead_in:
                pcm, lead_in = trim_lead_in(pcm, self.sample_rate), False
            yield pcm

    async def synthesize(self, text: str, *, first_clause: bool = False, speed: float = 1.0) -> AsyncIterator[np.ndarray]:
        """int16 mono PCM at sample_rate, one Piper sentence per item; `speed` 2.0 speaks twice as fast.

        `first_clause`: the reply's first words, which the user waits for in silence. They start
        without Piper's lead-in silence, and with a first-clause voice loaded they are synthesized
        on its threads while the LLM engine waits (inference/cpu.py): the rest of the reply has the
        whole clause's playing time to catch up."""
        loop = asyncio.get_running_loop()
        chunks = self._chunks(text, first_clause, speed)
        try:
            while True:
                pcm = await loop.run_in_executor(self._executor, next, chunks, None)
                if pcm is None:
                    return
                yield pcm
        finally:
            # A hop may still be running: closing on the same single worker waits for it, on no one's loop.
            try:
                self._executor.submit(chunks.close)
            except RuntimeError:
                pass  # closed engine: the generator is simply dropped

    def synthesize_blocking(self, text: str, *, first_clause: bool = False, speed: float = 1.0) -> np.ndarray:
        """Whole utterance on the calling thread, for tools and tests."""
        parts = list(self._chunks(text, first_clause, speed))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _session(model_path: Path | str, threads: int) -> Any:
    """An onnxruntime session on `threads` threads (PiperVoice.load would give it every core).

    Its workers sleep between runs instead of spinning: a spinning worker would hold a core the
    LLM engine is about to use."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
