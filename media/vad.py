"""Voice activity: a pure hysteresis core (TurnDetector), the Silero model, and a streaming wrapper.

TurnDetector takes per-window speech probabilities and emits speech started/stopped with the
settings of OpenAI's server_vad. SileroVad and StreamingVad are synchronous and cost ~0.1 ms a
window; callers run them off the event loop all the same.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from media.frames import AudioChunk

VAD_RATE = 16000
WINDOW_SAMPLES = 512  # what Silero v5/v6 take at 16 kHz
CONTEXT_SAMPLES = 64  # tail of the previous window the model sees in front of each window
WINDOW_MS = 1000.0 * WINDOW_SAMPLES / VAD_RATE  # 32 ms
_STATE_SHAPE = (1, 1, 128)
_SR = np.array(VAD_RATE, dtype=np.int64)


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5  # speech starts at or above this probability
    prefix_padding_ms: int = 300  # audio kept before the onset when the turn is committed
    silence_duration_ms: int = 500  # silence that ends a turn
    min_speech_ms: int = 100  # speech shorter than this (clicks, coughs) never starts a turn
    hysteresis: float = 0.15  # speech continues down to threshold - hysteresis

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        for name in ("prefix_padding_ms", "silence_duration_ms", "min_speech_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def continue_threshold(self) -> float:
        return max(self.threshold - self.hysteresis, 0.01)


@dataclass(frozen=True)
class VadSpeechStarted:
    audio_start_ms: int  # onset: start of the first speech window
    padded_start_ms: int  # onset minus prefix_padding_ms, clamped at 0: where the committed audio begins
    detected_ms: int  # stream time at which the decision was made (onset + >= min_speech_ms)


@dataclass(frozen=True)
class VadSpeechStopped:
    audio_end_ms: int  # end of the last speech window
    detected_ms: int  # stream time at which silence_duration_ms had passed


VadEvent = VadSpeechStarted | VadSpeechStopped


class TurnDetector:
    """Hysteresis over speech probabilities. States: idle, pending (onset seen, not yet min_speech), speaking."""

    def __init__(self, settings: VadSettings | None = None, window_ms: float = WINDOW_MS) -> None:
        self.settings = settings or VadSettings()  # replaceable at any time; applies from the next window
        self.window_ms = window_ms
        self.reset()

    def reset(self) -> None:
        self._onset_ms: float | None = None  # set in pending and speaking
        self._speaking = False
        self._last_speech_end_ms = 0.0
        self._silence_start_ms: float | None = None
        self._voiced_ms = 0.0  # the speech windows since the onset

    @property
    def in_speech(self) -> bool:
        return self._speaking

    @property
    def silence_started_ms(self) -> float | None:
        """Start of the silence running in a turn (it ends the turn after silence_duration_ms), if any."""
        return self._silence_start_ms if self._speaking else None

    @property
    def voiced_ms(self) -> float:
        """How much of the turn (pending or speaking) is speech: its windows that count as speech, silences left
        out, so a short word is short whatever silence the turn waits for after it."""
        return self._voiced_ms if self._onset_ms is not None else 0.0

    def _voiced(self, window_end_ms: float) -> None:
        self._last_speech_end_ms = window_end_ms
        self._voiced_ms += self.window_ms

    def feed(self, prob: float, window_end_ms: float) -> list[VadEvent]:
        s = self.settings
        start_ms = window_end_ms - self.window_ms
        if self._onset_ms is None:
            if prob >= s.threshold:
                self._onset_ms = start_ms
                self._voiced_ms = 0.0
                self._voiced(window_end_ms)
                return self._maybe_start(window_end_ms)
            return []
        if not self._speaking:
            if prob < s.continue_threshold:
                self._onset_ms = None  # too short: a click, not a turn
                return []
            self._voiced(window_end_ms)
            return self._maybe_start(window_end_ms)
        if prob >= s.threshold:
            self._silence_start_ms = None
            self._voiced(window_end_ms)
        elif prob < s.continue_threshold:
            if self._silence_start_ms is None:
                self._silence_start_ms = start_ms
        elif self._silence_start_ms is None:
            # Between the two thresholds: speech goes on, but it does not cancel a silence already running.
            self._voiced(window_end_ms)
        if self._silence_start_ms is not None and window_end_ms - self._silence_start_ms >= s.silence_duration_ms:
            end_ms = self._last_speech_end_ms
            self.reset()
            return [VadSpeechStopped(audio_end_ms=round(end_ms), detected_ms=round(window_end_ms))]
        return []

    def _maybe_start(self, window_end_ms: float) -> list[VadEvent]:
        assert self._onset_ms is not None
        if window_end_ms - self._onset_ms < self.settings.min_speech_ms:
            return []
        self._speaking = True
        self._silence_start_ms = None
        onset = self._onset_ms
        padded = max(0.0, onset - self.settings.prefix_padding_ms)
        return [VadSpeechStarted(audio_start_ms=round(onset), padded_start_ms=round(padded), detected_ms=round(window_end_ms))]


class SpeechModel(Protocol):
    def probability(self, window: np.ndarray) -> float: ...

    def reset(self) -> None: ...


@functools.lru_cache(maxsize=4)
def _inference_session(model_path: str) -> Any:
    """One ONNX session per model file for every stream: run() is thread-safe, the state is per stream."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])


class SileroVad:
    """Silero VAD, one 512-sample 16 kHz window at a time, from either of two ONNX files:

    - v6 as faster-whisper ships it: inputs `input`, `h`, `c` (LSTM state in two tensors); fed one row per call it
      gives exactly the probabilities of faster-whisper's batched pass;
    - 6.2.3 as the silero-vad package ships it (`silero_vad_16k_op15.onnx`): inputs `input`, `state`, `sr`.

    Each row is 64 samples of context + 512 new ones; the state is carried between calls.
    """

    def __init__(self, model_path: Path | str) -> None:
        self._session = _inference_session(str(model_path))
        inputs = {node.name for node in self._session.get_inputs()}
        if {"input", "h", "c"} <= inputs:
            self._split_state = True
        elif {"input", "state", "sr"} <= inputs:
            self._split_state = False
        else:
            raise ValueError(f"{model_path} is not a Silero VAD this reads (inputs {sorted(inputs)})")
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._state = np.zeros((2, *_STATE_SHAPE[1:]), dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def probability(self, window: np.ndarray) -> float:
        if window.shape != (WINDOW_SAMPLES,):
            raise ValueError(f"Silero takes {WINDOW_SAMPLES} samples at 16 kHz, got shape {window.shape}")
        window = window.astype(np.float32, copy=False)
        row = np.concatenate([self._context, window])[np.newaxis, :]
        if self._split_state:
            out, self._h, self._c = self._session.run(None, {"input": row, "h": self._h, "c": self._c})
        else:
            out, self._state = self._session.run(None, {"input": row, "state": self._state, "sr": _SR})
        self._context = window[-CONTEXT_SAMPLES:].copy()
        return float(np.asarray(out).reshape(-1)[0])


class StreamingVad:
    """16 kHz chunks of any length in, turn events out, on the input stream's own clock (ms since reset).

    One per stream: the model (SileroVad) carries that stream's recurrent state.
    """

    def __init__(self, model: SpeechModel, settings: VadSettings | None = None) -> None:
        self._model = model
        self.detector = TurnDetector(settings)
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows = 0
        self._offset_ms = 0.0
        self.last_probability = 0.0

    @property
    def position_ms(self) -> float:
        """Stream time of the end of the last window scored."""
        return self._offset_ms + self._windows * WINDOW_MS

    def reset(self, start_ms: float = 0.0) -> None:
        """Forget audio, model state and turn state; the next sample is at start_ms."""
        self._model.reset()
        self.detector.reset()
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows = 0
        self._offset_ms = start_ms
        self.last_probability = 0.0

    def process(self, chunk: AudioChunk) -> list[VadEvent]:
        if chunk.sample_rate != VAD_RATE:
            raise ValueError(f"StreamingVad takes {VAD_RATE} Hz audio, got {chunk.sample_rate} Hz")
        audio = np.concatenate([self._pending, chunk.to_float32()]) if self._pending.size else chunk.to_float32()
        events: list[VadEvent] = []
        full = audio.shape[0] // WINDOW_SAMPLES
        for i in range(full):
            self.last_probability = self._model.probability(audio[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES])
            self._windows += 1
            events += self.detector.feed(self.last_probability, self.position_ms)
        self._pending = audio[full * WINDOW_SAMPLES :].copy()
        return events
