"""Load a causal LM once: a transformers folder, or a GGUF file.

A GGUF file whose layers are quantized runs on a CPU with the engine's kernels as its own blocks (weight format
"gguf", gguf_weights.py): its config, tokenizer and tensor index are read once into
``cache_dir/<stem>-<hash of its bytes>-config/`` (a few MB: 11 s for the embedded model, 40 s for a 0.5B Qwen,
then 2-5 s a start), the model is built on the meta device and given only its norms, biases and embedding, and
the engine packs the layers from the file itself. Otherwise (another dtype, a GPU, no kernels, float layers)
loading a GGUF file through transformers takes ~20 s here (parsing its metadata and de-quantizing), so
the first load converts it into ``cache_dir/<stem>-<hash of its bytes>/`` with ``save_pretrained`` and
every later load reads that folder (< 1-2 s). The cache folder is written to a temporary directory and
renamed into place, so a crash never leaves a half-written cache behind. The folder is named after
the file's content, not its path or mtime: reinstalling the package that carries the embedded model
gives the same bytes a new mtime, and had cost a new 520 MB conversion each time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import cpu_kernels
from .constraints import GrammarCompiler
from .gguf_weights import GgufIndex, GgufWeights
from .kernel_paths import resolve_kernels
from .model_support import SUPPORTED_MODEL_TYPES, UnsupportedModel
from .threads import one_intra_op_thread
from .tool_calls import ToolFormat, template_tool_format
from .weight_formats import on_int4_grid

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

_EXTRA_EOS_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclass
class TokenizerModel:
    """A model's tokenizer and chat template without its weights: what the gateway needs to render prompts
    and read replies (backend.PromptModel) when a remote backend runs the weights."""

    tokenizer: PreTrainedTokenizerBase
    vocab_size: int  # the model's, which may exceed the tokenizer's (padded embedding rows)
    context_window: int  # model's max positions, capped by the caller's setting
    eos_token_ids: frozenset[int]  # from generation config + tokenizer (e.g. <|im_end|>)
    source: Path
    grammars: GrammarCompiler = field(init=False)  # grammar-constrained decoding over this tokenizer
    tool_format: ToolFormat = field(init=False)  # how the model is told of tools and calls them (tool_calls.py)

    def __post_init__(self) -> None:
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size)
        self.tool_format = template_tool_format(self.tokenizer)


@dataclass
class LoadedLM(TokenizerModel):
    model: PreTrainedModel = field(kw_only=True)
    device: torch.device = field(kw_only=True)
    dtype: torch.dtype = field(kw_only=True)
    load_seconds: float = field(kw_only=True)
    converted: bool = field(kw_only=True)  # True when this load did the GGUF -> safetensors conversion
    cache_dir: Path = field(kw_only=True)  # converted weights; also where the engine's C kernels are built (cpu_kernels.py)
    # Addition: "native" (the engine runs ``dtype`` weights: exact), "int8" / "int4" (dtype="int8" /
    # "int4": float32 weights kept for the model itself, the engine runs quantized copies; see weight_formats.py), or
    # "gguf" (a GGUF file's own blocks, each linear in the format that holds its type: gguf_weights.py).
    weight_format: str = field(default="native", kw_only=True)
    # Addition: which build of the engine's C kernels the forward runs on a CPU (kernel_paths.KERNEL_CHOICES:
    # "auto" is the fastest this CPU runs), or "torch" for torch's own.
    kernels: str = field(default="auto", kw_only=True)
    gguf: GgufWeights | None = field(default=None, kw_only=True)  # the file's blocks, under "gguf"


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} was asked for, but torch sees no GPU")
    return torch.device(device)


def _weights_are_4bit(model: torch.nn.Module) -> bool:
    """Whether the first layer's linear weights lie on a 4-bit group grid (a Q4_1 GGUF's do)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return False
    first = layers[0]
    matrices = [first.self_attn.q_proj.weight, first.mlp.down_proj.weight]
    return all(on_int4_grid(w.data.t()) for w in matrices)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # CUDA: bfloat16. CPU: float32 weights for the model itself; the engine may still run them as
        # int4 (see _weights_are_4bit). Measured on this 2-vCPU Xeon (avx512_bf16): the CPU kernels for
        # small bf16 matmuls (M=1..16 rows) do not reach the bandwidth bound, and bfloat16 everywhere
        # changes greedy outputs within a few dozen tokens (benchmarks/engine_options.py).
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32, "fp32": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16,
    }
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16, float16, int8 or int4") from None


GGUF_DIGESTS = "gguf-digests.json"  # in the cache dir: {"<path>|<size>|<mtime_ns>": digest}
_DIGEST = re.compile(r"[0-9a-f]{16}")


def _version_key(path: Path | str) -> str | None:
    """``"<resolved path>|<size>|<mtime_ns>"``, the digest index's key for a file as it is now; None
    when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def gguf_digest(path: Path, cache_dir: Path) -> str:
    """The first 16 hex digits of the sha256 of ``path``'s bytes. A file is read once per version
    (0.23 s for the embedded model's 98 MB here): the digest is remembered in ``cache_dir`` under the
    file's path, size and mtime, and entries of files that changed or went away are dropped."""
    key = _version_key(path)
    if key is None:
        raise FileNotFoundError(f"model not found: {path}")
    index_path = Path(cache_dir) / GGUF_DIGESTS
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if not isinstance(index, dict):
        index = {}
    known = index.get(key)
    if isinstance(known, str):
        return known
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            sha.update(chunk)
    digest = sha.hexdigest()[:16]
    # Entries of files that changed or went away go (a key is read from the right: a path may hold "|").
    index = {k: v for k, v in index.items() if _version_key(k.rsplit("|", 2)[0]) == k}
    index[key] = digest
    # Replaced atomically, so a concurrent reader sees the old index or the new one; where the cache
    # cannot be written, the file is just hashed again next time.
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=index_path.parent, prefix=f".{GGUF_DIGESTS}.")
    except OSError as exc:
        log.debug("could not remember the digest of %s: %s", path, exc)
        return digest
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(index, out)
        os.replace(tmp, index_path)
    except OSError as exc:
        log.debug("could not remember the digest of %s: %s", path, exc)
        Path(tmp).unlink(missing_ok=True)
    return digest


def prune_stale_conversions(path: Path, cache_dir: Path) -> list[Path]:
    """Remove the converted copies of other versions of ``path`` (same stem): those whose digest no
    current file in the digest index has. Returns what was removed. Run after a conversion, so that
    updating a model, or the cache's older naming by size and mtime, does not leave copies behind."""
    try:
        index = json.loads((Path(cache_dir) / GGUF_DIGESTS).read_text())
    except (OSError, ValueError):
        return []  # nothing known: keep everything
    live = set(index.values()) if isinstance(index, dict) else set()
    if not live:
        return []
    removed = []
    for folder in Path(cache_dir).glob(f"{path.stem}-*"):
        digest = folder.name[len(path.stem) + 1 :].removesuffix(CONFIG_SUFFIX)
        # Only this stem's conversions: "<stem>-<16 hex digits>" ("<stem>-v2-..." is another model's).
        if folder.is_dir() and _DIGEST.fullmatch(digest) and digest not in live:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def gguf_cache_folder(path: Path, cache_dir: Path) -> Path:
    """Where the converted copy of ``path`` lives: keyed by the GGUF file's name and content."""
    return Path(cache_dir) / f"{path.stem}-{gguf_digest(path, cache_dir)}"


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


@contextmanager
def _read_by_transformers(path: Path, index: GgufIndex) -> Iterator[None]:
    """transformers' GGUF reader refuses an architecture it does not map, or a tokenizer it cannot build, with a
    ValueError that names neither the file nor what runs: said here, at start."""
    try:
        yield
    except (ValueError, KeyError) as exc:
        raise UnsupportedModel(
            f"{path.name} (architecture {index.architecture!r}): its config or tokenizer cannot be read: {exc} "
            f"The engine serves GGUF files of {', '.join(sorted(SUPPORTED_MODEL_TYPES))}") from exc


def _convert_gguf(path: Path, index: GgufIndex, target: Path) -> None:
    """GGUF -> safetensors (float32, de-quantized) + tokenizer, written atomically into ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    with _read_by_transformers(path, index):
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    t1 = time.perf_counter()
    log.info("GGUF tokenizer parsed in %.2f s", t1 - t0)
    with _read_by_transformers(path, index):
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    t2 = time.perf_counter()
    log.info("GGUF model parsed and de-quantized in %.2f s", t2 - t1)
    # save_pretrained refuses a model loaded from GGUF while it still carries the quantizer.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - transformers types it as a quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # pragma: no cover - a non-empty leftover that is not a cache
                raise
            log.info("another process converted %s first; using its copy", path.name)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("GGUF converted to %s in %.2f s (save %.2f s)", target, time.perf_counter() - t0,
             time.perf_counter() - t2)


def _eos_ids(config, generation_config, tokenizer) -> frozenset[int]:
    ids: set[int] = set()

    def add(value) -> None:
        if value is None:
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                add(v)
        else:
            ids.add(int(value))

    if generation_config is not None:
        add(generation_config.eos_token_id)
    add(config.eos_token_id)
    add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    template = getattr(tokenizer, "chat_template", None) or ""
    for tok in _EXTRA_EOS_TOKENS:
        # A chat model ends its turn with the template's end-of-turn marker.
        if tok in vocab and tok in template:
            ids.add(int(vocab[tok]))
    return frozenset(ids)


def load_lm(
    path: Path,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    cache_dir: Path,
    threads: int = 0,
    max_context_tokens: int = 0,
    kernels: str = "auto",
) -> LoadedLM:
    """Load the model at ``path`` (a .gguf file or a transformers folder) for inference. ``kernels``
    is checked here, before the weights load: a build this CPU cannot run fails at once."""
    resolve_kernels(kernels)
    if threads > 0:
        torch.set_num_threads(threads)
    # With one intra-op thread: loading must not leave an OpenMP pool on the caller's thread (threads.py).
    with one_intra_op_thread():
        lm = _load_lm(path, device=device, dtype=dtype, cache_dir=cache_dir, max_context_tokens=max_context_tokens,
                      kernels=kernels)
    lm.kernels = kernels
    return lm


def load_tokenizer_model(path: Path, *, cache_dir: Path, max_context_tokens: int = 0) -> TokenizerModel:
    """The tokenizer, chat template, context window and end-of-turn ids of the model at ``path``, without
    its weights: what a gateway in front of a remote backend renders prompts with."""
    from transformers import AutoConfig, GenerationConfig

    path, cache_dir = Path(path).expanduser(), Path(cache_dir).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        folder, _ = _gguf_config(path, cache_dir)  # the tokenizer only: no conversion of the weights
    else:
        folder, _ = _model_folder(path, cache_dir)
    tokenizer = _load_tokenizer(folder)
    config = AutoConfig.from_pretrained(str(folder))
    try:
        generation = GenerationConfig.from_pretrained(str(folder))
    except OSError:  # a folder without generation_config.json
        generation = None
    return TokenizerModel(tokenizer=tokenizer, vocab_size=int(config.vocab_size),
                          context_window=_context_window(config, max_context_tokens),
                          eos_token_ids=_eos_ids(config, generation, tokenizer), source=Path(path))


GGUF_INDEX = "gguf-index.json"  # in a config folder: the file's tensor index (gguf_weights.GgufIndex)
CONFIG_SUFFIX = "-config"  # <stem>-<digest>-config/: a GGUF's config, tokenizer and index, no weights


def gguf_config_folder(path: Path, cache_dir: Path) -> Path:
    """Where a GGUF file's config, tokenizer and tensor index are kept for the engine that reads its blocks."""
    return Path(cache_dir) / f"{path.stem}-{gguf_digest(path, cache_dir)}{CONFIG_SUFFIX}"


def _gguf_config(path: Path, cache_dir: Path) -> tuple[Path, GgufIndex]:
    """The file's config folder (written once: transformers reads the config and tokenizer from the GGUF's
    metadata, seconds, not its weights) and its index."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder = gguf_config_folder(path, cache_dir)
    if (folder / "config.json").is_file() and (folder / GGUF_INDEX).is_file():
        return folder, GgufIndex.read(path, folder / GGUF_INDEX)
    started = time.perf_counter()
    log.info("reading %s's tensors, config and tokenizer once into %s", path.name, folder)
    index = GgufIndex.read(path)  # a truncated file or a type the engine does not serve: refused here, by name
    with _read_by_transformers(path, index):
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        config.save_pretrained(str(tmp))
        GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        index.keep(tmp / GGUF_INDEX)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / GGUF_INDEX).is_file():  # pragma: no cover - a leftover that is not a config folder
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process wrote it first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in prune_stale_conversions(path, cache_dir):
        log.info("removed %s, kept for another version of %s", stale, path.name)
    log.info("%s's config and tokenizer read in %.1f s", path.name, time.perf_counter() - started)
    return folder, index


def _gguf_blocks_model(path: Path, index: GgufIndex, folder: Path) -> tuple[PreTrainedModel, GgufWeights]:
    """The transformers model of a GGUF file for the engine that multiplies the file's blocks: built on the meta
    device from the config, then given the file's norms, biases and embedding (de-quantized) and empty linear
    weights, so no float copy of the layers (nor of a head in blocks) is ever made."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    gguf = GgufWeights(index, model)
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not hasattr(base, "rotary_emb"):
        raise UnsupportedModel(f"{path.name}: a {config.model_type} model does not have the Llama module layout")
    from_blocks = {id(m.weight) for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)}
    head = model.get_output_embeddings()
    tied = bool(getattr(config, "tie_word_embeddings", False)) and gguf.tensor("lm_head") is None
    if not tied and gguf.grid("lm_head") is not None:
        from_blocks.add(id(head.weight))
    for name, param in list(model.named_parameters()):
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        if id(param) in from_blocks:
            if gguf.tensor(module_name) is None:
                raise UnsupportedModel(f"{path.name} has no tensor for {name}")
            value = torch.empty(0)
        else:
            values = gguf.floats(name)
            if values is None:
                raise UnsupportedModel(f"{path.name} has no tensor for {name}")
            value = torch.from_numpy(np.array(values, dtype=np.float32))  # its own, writable copy
            if tuple(value.shape) != tuple(param.shape):
                raise UnsupportedModel(f"{path.name}: {name} is {tuple(value.shape)} in the file, "
                                       f"{tuple(param.shape)} in a {config.model_type} of this config")
        setattr(module, leaf, torch.nn.Parameter(value, requires_grad=False))
    if tied:
        head.weight = base.embed_tokens.weight
    # The rotary tables are computed, not read: made again on the CPU.
    base.rotary_emb = type(base.rotary_emb)(config=config)
    meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise UnsupportedModel(f"{path.name}: {', '.join(meta[:3])} are not read from the file")
    model.eval()
    return model, gguf


def _model_folder(path: Path, cache_dir: Path) -> tuple[Path, bool]:
    """The transformers folder of ``path`` (a GGUF file is converted once into the cache), and whether this call
    converted it."""
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    if not path.is_file():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json; not a transformers model folder")
        return path, False
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"{path} is a file but not a .gguf file; pass a .gguf file or a transformers folder")
    folder = gguf_cache_folder(path, cache_dir)
    if _is_complete(folder):
        return folder, False
    index = GgufIndex.read(path)  # a truncated file or a type the engine does not serve: refused by name, first
    log.info("converting %s once into %s", path.name, folder)
    _convert_gguf(path, index, folder)
    for stale in prune_stale_conversions(path, cache_dir):
        log.info("removed %s, the conversion of another version of %s", stale, path.name)
    return folder, True


def _load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("tokenizer loaded in %.2f s", time.perf_counter() - t0)
    return tokenizer


def _context_window(config, max_context_tokens: int) -> int:
    window = int(getattr(config, "max_position_embeddings", 0) or 0) or 2048
    return min(window, int(max_context_tokens)) if max_context_tokens > 0 else window


def _load_lm(path: Path, *, device: str, dtype: str, cache_dir: Path, max_context_tokens: int,
             kernels: str) -> LoadedLM:
    from transformers import AutoModelForCausalLM

    t_start = time.perf_counter()
    path = Path(path).expanduser()
    dev = _resolve_device(device)
    if dtype == "auto" and dev.type == "cpu" and path.is_file() and path.suffix.lower() == ".gguf":
        built = resolve_kernels(kernels)
        if built != "torch" and cpu_kernels.load(Path(cache_dir).expanduser(), built) is not None:
            folder, index = _gguf_config(path, Path(cache_dir).expanduser())
            if index.quantized_layers():
                return _load_gguf_blocks(path, index, folder, cache_dir=Path(cache_dir).expanduser(),
                                         max_context_tokens=max_context_tokens, started=t_start)
        else:  # no gcc, or a CPU without AVX2: the file is converted to floats (the reason is logged)
            log.warning("the engine's kernels do not run here: %s is converted and runs on torch's kernels",
                        path.name)
    quantized = dtype in ("int8", "int4")
    weight_format = dtype if quantized else "native"
    dt = _resolve_dtype("float32" if quantized else dtype, dev)
    folder, converted = _model_folder(path, Path(cache_dir).expanduser())
    tokenizer = _load_tokenizer(folder)
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dt, attn_implementation="sdpa")
    model.to(dev)  # type: ignore[arg-type]  # transformers' wrapper types ``to`` for modules only
    model.eval()
    model.requires_grad_(False)
    t2 = time.perf_counter()
    log.info("model loaded in %.2f s (%s, %s)", t2 - t1, dev, dt)

    if dtype == "auto" and dev.type == "cpu" and _weights_are_4bit(model):
        weight_format = "int4"  # the engine keeps these weights exactly, in about a seventh of the bytes
        log.info("the linear weights are 4-bit groups already: the engine runs them as int4")

    window = _context_window(model.config, max_context_tokens)
    lm = LoadedLM(
        model=model,
        tokenizer=tokenizer,
        vocab_size=int(model.config.vocab_size),
        device=dev,
        dtype=dt,
        context_window=window,
        eos_token_ids=_eos_ids(model.config, getattr(model, "generation_config", None), tokenizer),
        source=path,
        load_seconds=time.perf_counter() - t_start,
        converted=converted,
        cache_dir=Path(cache_dir).expanduser(),
        weight_format=weight_format,
    )
    log.info("LLM ready in %.2f s: %s, %d positions, eos %s", lm.load_seconds, path.name, window,
             sorted(lm.eos_token_ids))
    return lm


def _load_gguf_blocks(path: Path, index: GgufIndex, folder: Path, *, cache_dir: Path, max_context_tokens: int,
                      started: float) -> LoadedLM:
    """A GGUF file whose layers are blocks, for the engine that runs its own types (weight format "gguf"):
    nothing converted, nothing de-quantized but its norms, biases and embedding."""
    tokenizer = _load_tokenizer(folder)
    t1 = time.perf_counter()
    model, gguf = _gguf_blocks_model(path, index, folder)
    log.info("the engine runs %s's own types (%s); its norms, biases and embedding read in %.2f s", path.name,
             ", ".join(f"{k} x{n}" for k, n in sorted(index.types().items())), time.perf_counter() - t1)
    window = _context_window(model.config, max_context_tokens)
    lm = LoadedLM(
        model=model, tokenizer=tokenizer, vocab_size=int(model.config.vocab_size), device=torch.device("cpu"),
        dtype=torch.float32, context_window=window,
        eos_token_ids=_eos_ids(model.config, getattr(model, "generation_config", None), tokenizer), source=path,
        load_seconds=time.perf_counter() - started, converted=False, cache_dir=cache_dir, weight_format="gguf",
        gguf=gguf)
    log.info("LLM ready in %.2f s: %s, %d positions, eos %s", lm.load_seconds, path.name, window,
             sorted(lm.eos_token_ids))
    return lm
