"""The engine's own CPU kernels: one library, built from C at first use and loaded with ctypes.

- ``q4_vnni.c``: int4 weights times 15-bit activations on AVX512-VNNI (see q4_vnni.py);
- ``q8_vnni.c``: the output head's int8 weights times 15-bit activations (see q8_vnni.py);
- ``decode_attention.c``: attention of a step's rows, decoding or prompt, each over its own KV slot
  (see decode_attention.py);
- ``layer_stack.c``: a step's decoder layers in one call, on the two kernels above (see layer_stack.py);
- ``kernels.h``: their entry points, for the sources that call one another;
- ``simd.h``: what they share: a vectorized exp (SiLU, softmax) and VPDPBUSD with a broadcast operand.

The sources are compiled once per machine with gcc into ``<cache>/kernels/`` (about a second; the
file name carries a hash of the sources, the flags, gcc's and torch's versions, and builds of older
sources are removed). ctypes lets go of the GIL during a call. The library's OpenMP loops run on
torch's own libgomp (already loaded under the same soname), so the process keeps one OpenMP runtime
and the calling thread's ``torch.set_num_threads`` applies. Without gcc or without the instructions,
:func:`load` returns None and the engine runs torch's kernels instead.
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

SOURCES = tuple(Path(__file__).with_name(name) for name in ("q4_vnni.c", "q8_vnni.c", "decode_attention.c",
                                                                "layer_stack.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("simd.h", "kernels.h"))
REQUIRED_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"})
COMPILE_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp",
                 "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
PREFIX = "cpu_kernels-"

_c_int, _ptr = ctypes.c_int, ctypes.c_void_p
SIGNATURES = {
    "q4_vnni_matmul": [_ptr, _c_int, _c_int, _ptr, _c_int, _ptr, _ptr, ctypes.c_float, _c_int, _c_int],
    "q8_vnni_matmul": [_ptr, _c_int, _c_int, _ptr, _ptr, _c_int, _ptr],
    "decode_attention": [_ptr, _c_int, _c_int, _c_int, _c_int, _c_int, _ptr, _c_int, _c_int, _c_int, _ptr, _ptr,
                         _ptr, _ptr, _c_int, ctypes.c_float, _ptr],
    "layer_stack": [_ptr, _c_int, _c_int, _c_int, *[_ptr] * 12, _c_int, _c_int, _c_int, _c_int, _ptr, ctypes.c_size_t,
                    _c_int, _c_int, _c_int, _ptr, _ptr, _ptr, _ptr, _c_int, ctypes.c_float, _ptr, _ptr, _ptr],
}

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
        subprocess.run([compiler, *COMPILE_FLAGS, "-o", tmp, *map(str, SOURCES)], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent process sees the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(cache_dir: Path) -> ctypes.CDLL | None:
    """The library built in ``cache_dir/kernels/``, or None where it cannot run (the reason is logged
    once)."""
    cache_dir = Path(cache_dir).expanduser()
    with _lock:
        if cache_dir in _loaded:
            return _loaded[cache_dir]
        lib = None
        compiler = shutil.which("gcc")
        missing = REQUIRED_CPU_FLAGS - cpu_flags()
        if platform.machine() != "x86_64" or missing:
            log.info("the engine's CPU kernels are not used: the CPU lacks %s", sorted(missing) or platform.machine())
        elif compiler is None:
            log.warning("the engine's CPU kernels are not used: no gcc to build them (torch's kernels run instead)")
        else:
            version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
            digest = hashlib.sha256(
                b"".join(s.read_bytes() for s in SOURCES + HEADERS) + " ".join(COMPILE_FLAGS + [version, torch.__version__]).encode()
            ).hexdigest()[:16]
            target = cache_dir / "kernels" / f"{PREFIX}{digest}.so"
            try:
                if not target.exists():
                    _compile(target, compiler)
                    for stale in target.parent.glob("*.so"):  # builds of older sources
                        if stale != target:
                            stale.unlink(missing_ok=True)
                lib = ctypes.CDLL(str(target))
                for name, argtypes in SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or exc
                log.warning("the engine's CPU kernels are not used: building them failed: %s", detail)
                lib = None
        _loaded[cache_dir] = lib
        return lib
