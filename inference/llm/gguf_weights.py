"""A GGUF file's tensors as the engine runs them: each linear weight in the grouped format that holds its own
type (gguf_blocks.py), found by the name of the transformers module it loads into.

transformers would de-quantize every tensor to float; the engine reads each linear's blocks from the file instead,
so that a Q8_0 or Q6_K weight runs in 8 bits, a Q5_0 one in 5 and a Q4_K one in 4, as the user's file says, and
only the norms, biases and embedding become floats (loader.py builds the model around them). The names map as transformers maps
them (gguf-py's tensor name map), and a Llama-architecture file's query and key rows are put back in the order
transformers puts them (llama.cpp's converter permutes them for its rotary layout).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants

from . import gguf_blocks
from .gguf_blocks import GroupGrid


class GgufTypeError(ValueError):
    """A GGUF file the engine cannot read, or a tensor of a type it does not serve."""


@dataclass(frozen=True)
class GgufTensor:
    name: str  # the GGUF's
    kind: GGMLQuantizationType
    rows: int
    columns: int
    offset: int  # of its data in the file
    nbytes: int


@dataclass(frozen=True)
class GgufIndex:
    """What the engine reads of a GGUF file: its architecture and name, and where each tensor lies. gguf-py's
    reader parses every metadata field (the vocabulary too: 2.5 s for the embedded model, 7 s for a 0.5B Qwen), so
    the index is kept as JSON beside the file's conversion (``index_file``) and later starts read that."""

    path: Path
    architecture: str
    name: str
    tensors: dict[str, GgufTensor]

    @classmethod
    def read(cls, path: Path, index_file: Path | None = None) -> GgufIndex:
        """The index of ``path``: from ``index_file`` when it is there, else read with gguf-py (and kept there).
        A file that is not a whole GGUF, or a tensor of a type the engine does not serve, raises GgufTypeError."""
        path = Path(path)
        if index_file is not None:
            try:
                kept = json.loads(index_file.read_text())
                return cls(path, kept["architecture"], kept["name"],
                           {t[0]: GgufTensor(t[0], _served(path, t[0], t[1]), *t[2:]) for t in kept["tensors"]})
            except (OSError, ValueError, KeyError, TypeError):
                pass  # absent or unreadable: read the file again
        reader = _reader(path)
        tensors = {}
        for tensor in reader.tensors:
            kind = _served(path, tensor.name, int(tensor.tensor_type))
            shape = [int(n) for n in tensor.shape]
            columns, rows = (shape[0], int(np.prod(shape[1:]))) if len(shape) >= 2 else (shape[0], 1)
            tensors[tensor.name] = GgufTensor(tensor.name, kind, rows, columns, int(tensor.data_offset),
                                              int(tensor.n_bytes))
        index = cls(path, _text(reader, "general.architecture"), _text(reader, "general.name"), tensors)
        if index_file is not None:
            index.keep(index_file)
        return index

    def keep(self, index_file: Path) -> None:
        """Write the index to ``index_file`` (atomically; nothing where the cache cannot be written)."""
        _write_atomically(index_file, json.dumps({
            "architecture": self.architecture, "name": self.name,
            "tensors": [[t.name, int(t.kind), t.rows, t.columns, t.offset, t.nbytes] for t in self.tensors.values()]}))

    def quantized_layers(self) -> bool:
        """Whether the decoder layers' weights ("blk.N.*") are blocks, not floats."""
        return any(name.startswith("blk.") and gguf_blocks.bits_for(t.kind) is not None
                   for name, t in self.tensors.items())

    def types(self) -> Counter[str]:
        return Counter(t.kind.name for t in self.tensors.values())

    def data(self, tensor: GgufTensor) -> np.ndarray:
        """A block tensor's bytes, uint8 ``[rows, bytes a row]``, memory-mapped."""
        if tensor.offset + tensor.nbytes > self.path.stat().st_size:
            raise GgufTypeError(f"{self.path.name}: tensor {tensor.name} runs past the end of the file (truncated?)")
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(tensor.nbytes,))
        return raw.reshape(tensor.rows, -1)


def _served(path: Path, name: str, code: int) -> GGMLQuantizationType:
    try:
        kind = GGMLQuantizationType(code)
    except ValueError:
        raise GgufTypeError(f"{path.name}: tensor {name} has type {code}, which no GGUF type has") from None
    if kind not in gguf_blocks.SERVED:
        served = ", ".join(sorted(k.name for k in gguf_blocks.SERVED))
        raise GgufTypeError(f"{path.name}: tensor {name} is {kind.name}, a GGUF type the engine does not serve "
                            f"(it serves {served})")
    return kind


def _write_atomically(target: Path, text: str) -> None:
    """Written beside ``target`` and renamed over it; where the cache cannot be written, nothing is kept."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, target)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


class GgufWeights:
    """A GGUF file's tensors by the transformers parameter they load into (``model.layers.0.self_attn.q_proj.weight``),
    for a model of the file's architecture: the linear weights as groups, everything else as floats."""

    def __init__(self, index: GgufIndex, model: Any) -> None:
        from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

        self.index = index
        self.path = index.path
        self.architecture = index.architecture
        config = model.config
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)
        arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == index.architecture), None)
        if arch is None:
            raise GgufTypeError(f"{self.path.name}: architecture {index.architecture!r} is not one gguf-py maps")
        # gguf-py's map of transformers names to the file's, as transformers' own loader uses it (built once
        # here: transformers builds it again for every submodule, 6 s for the embedded model).
        names = get_tensor_name_map(arch, int(config.num_hidden_layers))
        params: dict[str, GgufTensor] = {}
        for hf_name in model.state_dict():
            module, _, kind = hf_name.rpartition(".")
            gguf_name = names.get_name(module)
            tensor = None if gguf_name is None else index.tensors.get(f"{gguf_name}.{kind}")
            if tensor is not None:
                params[hf_name] = tensor
        self._params = params

    def tensor(self, module: str) -> GgufTensor | None:
        """The tensor a module's weight loads from; None when the file has none for it (a tied output head)."""
        return self._params.get(f"{module}.weight")

    def grid(self, module: str) -> GroupGrid | None:
        """The module's weight as groups of 32, in its type's width; None for a float type or no tensor."""
        tensor = self.tensor(module)
        if tensor is None or gguf_blocks.bits_for(tensor.kind) is None:
            return None
        grid = gguf_blocks.decode(tensor.kind, self.index.data(tensor), tensor.columns)
        if self._permuted(module):
            grid = _rows(grid, _unpermuted_rows(tensor.rows, self._rotary_heads(module)))
        return grid

    def floats(self, param: str) -> np.ndarray | None:
        """A parameter's values as float32 (``[rows, columns]``, or ``[columns]`` for a vector), de-quantized
        where they are blocks; None when the file has no tensor for it."""
        tensor = self._params.get(param)
        if tensor is None:
            return None
        values = quants.dequantize(self.index.data(tensor), tensor.kind).astype(np.float32, copy=False)
        values = values.reshape(tensor.rows, tensor.columns) if tensor.rows > 1 else values.reshape(tensor.columns)
        module = param.rpartition(".")[0]
        if self._permuted(module):
            values = values[_unpermuted_rows(tensor.rows if tensor.rows > 1 else tensor.columns,
                                             self._rotary_heads(module))]
        return values

    def _permuted(self, module: str) -> bool:
        return self.architecture == "llama" and module.endswith((".q_proj", ".k_proj"))

    def _rotary_heads(self, module: str) -> int:
        return self._heads if module.endswith(".q_proj") else self._kv_heads


def stacked(grids: list[GroupGrid]) -> GroupGrid:
    """Matrices with the same inputs one above the other (a fused qkv or gate_up), in the widest of their widths:
    a 4-bit grid's numbers are 5- and 8-bit ones too, a 5-bit grid's 8-bit ones."""
    return GroupGrid(np.concatenate([g.step for g in grids]), np.concatenate([g.low for g in grids]),
                     np.concatenate([g.q for g in grids]), max(g.bits for g in grids))


def _rows(grid: GroupGrid, order: np.ndarray) -> GroupGrid:
    return GroupGrid(grid.step[order], grid.low[order], grid.q[order], grid.bits)


def _unpermuted_rows(rows: int, heads: int) -> np.ndarray:
    """The row order transformers' LlamaTensorProcessor gives a query or key matrix read from a GGUF: within each
    head, the interleaved halves back to their blocks."""
    dim = rows // heads // 2
    return np.arange(rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(rows)


def _reader(path: Path) -> GGUFReader:
    """The file's reader (memory-mapped); a file that is not a whole GGUF raises GgufTypeError with the reason."""
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError, KeyError, IndexError, struct.error) as exc:
        raise GgufTypeError(f"{path.name} is not a readable GGUF file: {exc or type(exc).__name__}") from None


def _text(reader: GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None:
        return ""
    return bytes(field.parts[-1]).decode("utf-8", errors="replace")

