"""int4 weights times int8 activations on AVX512-VNNI: the int4 kernel for CPUs that have it.

torch's own int4 kernel (``_weight_int4pack_mm_for_cpu``) dequantizes the weights to float and
multiplies with float FMAs, once per block of 4 rows, so its cost grows with the rows. Here the 4-bit
weights meet 8-bit activations in VPDPBUSD, 64 products per instruction, as in llama.cpp's Q4_1 x
Q8_1 dot product; the activations take two such passes, for 15 bits (q4_vnni.c). All 30 layers of
the embedded model (``python -m benchmarks.int4_kernels``): 1.4-2.3x torch's kernel for 8 rows and
1.7-1.9x for 64-256; for 1 row, where both read the same bytes, 1.8x on a quiet machine (2.4-2.6 vs
4.4-4.5 ms) and even when its memory bandwidth was contended (5.3-6.7 ms for both). No library on PyPI offers this for torch
tensors on this torch (torchao's wheel there carries CUDA kernels only; Intel's extension stops at
torch 2.8).

The C source is compiled once per machine with gcc into ``<cache>/kernels/`` and loaded with
ctypes (which lets go of the GIL during the call). It runs its OpenMP loop on torch's own libgomp
(the library already loaded under the same soname), so the process keeps one OpenMP runtime and
the calling thread's ``torch.set_num_threads`` applies. Without gcc or without the instructions,
:func:`load` returns None and the int4 format runs on torch's kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("q4_vnni.c")
GROUP = 32
TILE = 16
REQUIRED_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"})
COMPILE_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp",
                 "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL | None] = {}


def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _compile(target: Path, compiler: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *COMPILE_FLAGS, "-o", tmp, str(SOURCE)], check=True, capture_output=True,
                       text=True, timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent process sees the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(cache_dir: Path) -> ctypes.CDLL | None:
    """The kernel library built in ``cache_dir/kernels/``, or None where it cannot run (the reason is
    logged once)."""
    cache_dir = Path(cache_dir).expanduser()
    with _lock:
        if cache_dir in _loaded:
            return _loaded[cache_dir]
        lib = None
        compiler = shutil.which("gcc")
        missing = REQUIRED_CPU_FLAGS - cpu_flags()
        if platform.machine() != "x86_64" or missing:
            log.info("int4 x int8 VNNI kernel not used: the CPU lacks %s", sorted(missing) or platform.machine())
        elif compiler is None:
            log.warning("int4 x int8 VNNI kernel not used: no gcc to build it (torch's int4 kernel runs instead)")
        else:
            version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
            digest = hashlib.sha256(
                SOURCE.read_bytes() + " ".join(COMPILE_FLAGS + [version, torch.__version__]).encode()
            ).hexdigest()[:16]
            target = cache_dir / "kernels" / f"q4_vnni-{digest}.so"
            try:
                if not target.exists():
                    _compile(target, compiler)
                    for stale in target.parent.glob("q4_vnni-*.so"):  # builds of older sources
                        if stale != target:
                            stale.unlink(missing_ok=True)
                lib = ctypes.CDLL(str(target))
                fn = lib.q4_vnni_matmul
                fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_void_p]
                fn.restype = ctypes.c_int
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or exc
                log.warning("int4 x int8 VNNI kernel not used: building it failed: %s", detail)
                lib = None
        _loaded[cache_dir] = lib
        return lib


def pack(step: torch.Tensor, low: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The kernel's weight blob (see q4_vnni.c) from a Q4_1 grid: ``step`` and ``low`` ``[out, in/32]``,
    ``q`` ``[out, in/32, 32]`` whole numbers 0..15. ``d`` and ``m`` are stored as float16, as Q4_1 itself
    stores them."""
    n, groups, _ = q.shape
    if n % TILE:
        raise ValueError(f"the kernel needs outputs in multiples of {TILE}, not {n}")
    tiles = n // TILE
    # [tiles, 16 outputs, groups, 8 quads, 4 inputs] -> [tiles, groups, 8 quads, 16 outputs, 4 inputs]
    q = q.to(torch.uint8).reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    nibbles = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).reshape(tiles, groups, 256)

    def per_tile(values: torch.Tensor) -> torch.Tensor:
        half = values.reshape(tiles, TILE, groups).permute(0, 2, 1).to(torch.float16).contiguous()
        return half.view(torch.uint8).reshape(tiles, groups, 2 * TILE)

    return torch.cat([nibbles, per_tile(step), per_tile(low)], dim=2).contiguous()


def matmul(lib: ctypes.CDLL, x: torch.Tensor, blob: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x @ W`` for a float32 ``[rows, in]`` x and W packed by :func:`pack`: float32 ``[rows, out]``."""
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty((rows, out_features), dtype=torch.float32)
    if rows and lib.q4_vnni_matmul(x.data_ptr(), rows, k, blob.data_ptr(), out_features, y.data_ptr()) != 0:
        raise MemoryError("q4_vnni_matmul could not allocate its activation buffers")
    return y
