"""Text to speech with Piper on a worker thread of its own, one sentence chunk per thread hop.

Advancing Piper's blocking generator one chunk per hop lets a cancelled response stop between
chunks: the rest of the text is never synthesized and the worker is free for the next reply.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from inference.cpu import using_cores


class TtsEngine:
    def __init__(self, voice: object, *, volume: float, load_seconds: float, threads: int = 1) -> None:
        from piper import SynthesisConfig

        self._voice = voice  # piper.PiperVoice
        self._config = SynthesisConfig(normalize_audio=True, volume=volume)
        self.sample_rate: int = voice.config.sample_rate  # type: ignore[attr-defined]
        self.load_seconds = load_seconds
        self.threads = threads  # onnxruntime's intra-op threads: the cores a synthesis keeps busy
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts")

    @classmethod
    def load(
        cls,
        model_path: Path | str,
        config_path: Path | str | None = None,
        threads: int = 1,
        *,
        volume: float = 0.9,
        warmup: bool = True,
    ) -> TtsEngine:
        """Blocking. volume < 1 leaves headroom: Piper peaks every sentence at full scale and resampling overshoots."""
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        started = time.perf_counter()
        config_file = Path(config_path) if config_path else Path(f"{model_path}.json")
        config = PiperConfig.from_dict(json.loads(config_file.read_text(encoding="utf-8")))
        # PiperVoice.load gives onnxruntime every core; build the session ourselves to bound its threads.
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        engine = cls(PiperVoice(session=session, config=config), volume=volume, load_seconds=0.0, threads=threads)
        if warmup:
            engine.synthesize_blocking("Hello.")  # also loads espeak-ng's data once
        engine.load_seconds = time.perf_counter() - started
        return engine

    def _chunks(self, text: str) -> Generator[np.ndarray, None, None]:
        sentences = iter(self._voice.synthesize(text, syn_config=self._config))  # type: ignore[attr-defined]
        while True:
            with using_cores(self.threads):  # the synthesis happens inside next()
                chunk = next(sentences, None)
            if chunk is None:
                return
            yield chunk.audio_int16_array

    async def synthesize(self, text: str) -> AsyncIterator[np.ndarray]:
        """int16 mono PCM at sample_rate, one Piper sentence per item."""
        loop = asyncio.get_running_loop()
        chunks = self._chunks(text)
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

    def synthesize_blocking(self, text: str) -> np.ndarray:
        """Whole utterance on the calling thread, for tools and tests."""
        parts = list(self._chunks(text))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
