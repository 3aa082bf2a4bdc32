"""On a machine with a GPU: the gateway runs its models on CUDA (skipped elsewhere)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from tests.gateway_process import start_gateway

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_models_load_on_cuda_and_answer(tmp_path: Path) -> None:
    gateway = start_gateway("--device", "cuda", log_path=tmp_path / "gateway.log")
    try:
        health = httpx.get(f"{gateway.url}/healthz").json()
        assert health["device"] == "cuda" and health["voice"] is True
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

