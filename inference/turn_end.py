"""End of turn from the audio: Pipecat's Smart Turn v3, a Whisper-tiny encoder with a classifier head trained on
whether a speaker has finished (intonation, pace, a trailing "and..."), in 23 languages.

It reads the last 8 s of the turn (zero-padded at the front) as Whisper's 80-bin log-mel features of the
waveform normalized to zero mean and unit variance, as it was trained, and returns P(the turn is complete).
The ONNX file ships inside the `pipecat-ai` wheel, installed without its dependencies: it is found on disk and
`pipecat` is never imported. One call costs about 30 ms of one core (Intel Xeon, AVX512-VNNI); calls from every
session run one at a time on the model's own thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from inference.cpu import using_cores
from inference.models import ModelNotFound

log = logging.getLogger(__name__)

RATE = 16000
WINDOW_SAMPLES = 8 * RATE  # what the model was trained on; longer turns keep their end


def import_feature_extractor() -> None:
    """Import transformers' Whisper features before the models load side by side: imported in the ASR's loading
    thread while the LLM's thread imported other transformers models, it failed the start now and then
    (KeyError: 'transformers.models', a race in transformers' lazy modules)."""
    from transformers import WhisperFeatureExtractor  # noqa: F401


class TurnEndModel:
    def __init__(self, session: Any, features: Any, load_seconds: float) -> None:
        self._session = session
        self._features = features
        self.load_seconds = load_seconds
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-end")

    @classmethod
    def load(cls, path: Path) -> TurnEndModel:
        import onnxruntime
        from transformers import WhisperFeatureExtractor

        if not path.exists():
            raise ModelNotFound(f"end-of-turn model not found at {path}")
        started = time.monotonic()
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1  # one core: the turn's ASR and the reply's TTS need the others
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        session = onnxruntime.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        features = WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, chunk_length=WINDOW_SAMPLES // RATE)
        model = cls(session, features, time.monotonic() - started)
        model.probability_now(np.zeros(RATE, dtype=np.float32))  # the first run plans the graph: not on a turn
        log.info("end-of-turn model %s loaded in %.2f s", path.name, model.load_seconds)
        return model

    def probability_now(self, audio: np.ndarray) -> float:
        """P(complete) for a turn's 16 kHz mono float32 audio, on the calling thread."""
        window = np.asarray(audio[-WINDOW_SAMPLES:], dtype=np.float32)
        window = np.pad(window, (WINDOW_SAMPLES - len(window), 0))
        with using_cores(1, work="end_of_turn"):
            inputs = self._features(window, sampling_rate=RATE, return_tensors="np", do_normalize=True).input_features
            (logits,) = self._session.run(None, {"input_features": inputs.astype(np.float32)})
        return float(np.asarray(logits).reshape(-1)[0])  # the exported head ends in a sigmoid

    async def probability(self, audio: np.ndarray) -> float:
        """As probability_now, on the model's thread (never on the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.probability_now, audio)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
