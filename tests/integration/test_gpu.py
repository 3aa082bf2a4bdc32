"""On a machine with a GPU: the gateway runs its models on CUDA (skipped elsewhere)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from inference.asr import AsrEngine
from inference.models import DeviceUnavailable, asr_device, embedded_asr, embedded_tts, tts_device
from inference.tts import TtsEngine
from tests.conftest import QUESTION
from tests.gateway_process import start_gateway

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _on_cuda(choose: object) -> bool:
    try:
        return choose("cuda") == "cuda"  # type: ignore[operator]
    except DeviceUnavailable:
        return False


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c == " ").split())


def test_models_load_on_cuda_and_answer(tmp_path: Path) -> None:
    gateway = start_gateway("--device", "cuda", log_path=tmp_path / "gateway.log")
    try:
        health = httpx.get(f"{gateway.url}/healthz").json()
        assert health["device"] == "cuda" and health["voice"] is True
        assert health["devices"] == {"llm": "cuda", "asr": "cuda/float16" if _on_cuda(asr_device) else "cpu/int8",
                                     "tts": "cuda" if _on_cuda(tts_device) else "cpu"}
        body = {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 20,
        }
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60).json()
        assert "Paris" in answer["choices"][0]["message"]["content"]
    finally:
        gateway.stop()



@pytest.mark.skipif(not _on_cuda(asr_device), reason="CTranslate2 sees no CUDA device")
async def test_whisper_on_cuda_in_float16(question_16k: np.ndarray) -> None:
    """Both of faster-whisper's paths on CUDA: the live short window and the long-form transcription."""
    asr = AsrEngine.load(embedded_asr(), device=asr_device("auto"))
    try:
        assert (asr.device, asr.compute_type) == ("cuda", "float16")
        audio = question_16k.astype(np.float32) / 32768
        short = await asr.transcribe(audio, final=True)
        assert short is not None and _words(short.text) == _words(QUESTION), short
        long = await asr.transcribe_long(np.concatenate([audio, np.zeros(16000 * 31, np.float32), audio]))
        segments = [segment async for segment in long.segments]
        assert _words(" ".join(s.text for s in segments)) == _words(f"{QUESTION} {QUESTION}"), segments
        assert segments[0].start < 1.0 and segments[-1].start >= 30.0  # the second window
    finally:
        asr.close()


@pytest.mark.skipif(not _on_cuda(tts_device), reason="onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu)")
def test_piper_on_cuda() -> None:
    tts = TtsEngine.load(embedded_tts(), device="cuda", variation=False)
    try:
        assert tts.device == "cuda"
        pcm = tts.synthesize_blocking(QUESTION)
        assert pcm.dtype == np.int16 and len(pcm) > tts.sample_rate and np.abs(pcm).max() > 1000
    finally:
        tts.close()
