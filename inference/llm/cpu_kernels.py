"""The engine's own CPU kernels: one library per instruction set, built from C at first use and loaded
with ctypes.

- ``q4_matmul.c``: int4 (and 5- and 8-bit) weights in groups of 32 times 15-bit activations (see q4_matmul.py);
- ``q8_matmul.c``: the output head's int8 weights times 15-bit activations (see q8_matmul.py);
- ``decode_attention.c``: attention of a step's rows, decoding or prompt, each over its own KV slot
  (see decode_attention.py);
- ``layer_stack.c``: a step's decoder layers in one call, on the two kernels above (see layer_stack.py);
- ``kernels.h``: their entry points, for the sources that call one another and for ctypes
  (:data:`SIGNATURES` is read from it);
- ``simd.h``: what they share: 16-lane vectors for both builds, a vectorized exp (SiLU, softmax), the
  15-bit split of the activations.

The same sources build twice (:data:`ISAS`): ``vnni`` (AVX512 with VNNI) and ``avx2`` (AVX2, FMA and
F16C: every x86-64 CPU since about 2015, AMD's included), and the two return bit for bit the same
results for the same inputs (simd.h says how; tests/engine check it). Each build is compiled once per
machine with gcc into ``<cache>/kernels/`` (about a second; the file name carries the build and a
hash of the sources, the flags, gcc's and torch's versions, and older builds of the same instruction
set are removed). ctypes lets go of the GIL during a call. The library's OpenMP loops run on torch's
own libgomp (already loaded under the same soname), so the process keeps one OpenMP runtime and the
calling thread's ``torch.set_num_threads`` applies. Without gcc or without the instructions,
:func:`load` returns None and the engine runs torch's kernels instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("q4_matmul.c", "q8_matmul.c", "decode_attention.c",
                                                                "layer_stack.c"))
HEADER = Path(__file__).with_name("kernels.h")
HEADERS = (Path(__file__).with_name("simd.h"), HEADER)
ISAS = ("vnni", "avx2")  # the library's builds, fastest first
# What each build needs of the CPU (as /proc/cpuinfo names it) and asks of gcc.
REQUIRED_CPU_FLAGS = {
    "vnni": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
}
ISA_FLAGS = {
    "vnni": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
}
# ISO C (-std=c11) keeps gcc from contracting a product and a sum into an FMA: the kernels' float
# operations are exactly the ones written, in both builds. Warnings are errors, so that a build never
# half-works on another gcc.
COMPILE_FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wextra", "-Werror")
PREFIX = "cpu_kernels-"

_C_TYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "size_t": ctypes.c_size_t}


def _argument_type(declaration: str) -> type:
    if "*" in declaration:
        return ctypes.c_void_p
    words = [w for w in declaration.split() if w != "const"]
    if len(words) != 2 or words[0] not in _C_TYPES:
        raise ValueError(f"an argument ctypes is not told how to pass: {declaration.strip()!r}")
    return _C_TYPES[words[0]]


def c_functions(source: str) -> dict[str, list[type]]:
    """The ctypes argument types of every ``int name(...)`` that ``source`` (C text) declares or defines
    at the start of a line: kernels.h's entry points, or a .c file's exported functions (its others are
    static)."""
    text = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return {name: [_argument_type(a) for a in arguments.split(",")]
            for name, arguments in re.findall(r"^int\s+(\w+)\s*\(([^)]*)\)\s*[;{]", text, flags=re.M)}


# Each entry point's ctypes arguments (every one returns int), from kernels.h: a prototype changed
# there changes here with it.
SIGNATURES = c_functions(HEADER.read_text())

_lock = threading.Lock()
_loaded: dict[tuple[Path, str], ctypes.CDLL | None] = {}


def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# The instructions that compute in bfloat16 (/proc/cpuinfo's names). Without them torch's bfloat16 kernels take
# emulated paths: on an AMD EPYC Zen 3 (AVX2 only) a decode step of the embedded model took about 2 s in bfloat16
# against tens of milliseconds in float32.
BFLOAT16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def has_bfloat16_instructions(flags: frozenset[str] | None = None) -> bool:
    """Whether a CPU with these ``flags`` (default: this one's) computes bfloat16 in hardware."""
    return bool(BFLOAT16_CPU_FLAGS & (cpu_flags() if flags is None else flags))


def supported_isas(flags: frozenset[str] | None = None, machine: str | None = None) -> tuple[str, ...]:
    """The builds a CPU with these ``flags`` (default: this one's) runs, fastest first: every
    AVX512-VNNI CPU also runs the AVX2 build."""
    flags = cpu_flags() if flags is None else flags
    if (platform.machine() if machine is None else machine) != "x86_64":
        return ()
    return tuple(isa for isa in ISAS if REQUIRED_CPU_FLAGS[isa] <= flags)


def compile_library(isa: str, target: Path, compiler: str = "gcc") -> None:
    """Compile the ``isa`` build into ``target``, whatever this CPU runs (only running a build needs
    its instructions). Raises ``subprocess.CalledProcessError`` with gcc's messages in ``stderr``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *COMPILE_FLAGS, *ISA_FLAGS[isa], "-o", tmp, *map(str, SOURCES)], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent process sees the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build_name(isa: str, compiler: str) -> str:
    version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    digest = hashlib.sha256(
        b"".join(s.read_bytes() for s in SOURCES + HEADERS)
        + " ".join([*COMPILE_FLAGS, *ISA_FLAGS[isa], version, torch.__version__]).encode()
    ).hexdigest()[:16]
    return f"{PREFIX}{isa}-{digest}.so"


def _remove_older_builds(target: Path, isa: str) -> None:
    """Every other library in target's folder but the other instruction sets' builds: older builds
    of this one, and those of older layouts (one build for all)."""
    others = tuple(f"{PREFIX}{other}-" for other in ISAS if other != isa)
    for stale in target.parent.glob("*.so"):
        if stale != target and not stale.name.startswith(others):
            stale.unlink(missing_ok=True)


def load(cache_dir: Path, isa: str) -> ctypes.CDLL | None:
    """The library built for ``isa`` (one of ISAS) in ``cache_dir/kernels/``, or None where it cannot
    run: a CPU without its instructions, no gcc, a failed build (the reason is logged once)."""
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {ISAS}, not {isa!r}")
    cache_dir = Path(cache_dir).expanduser()
    with _lock:
        if (cache_dir, isa) in _loaded:
            return _loaded[(cache_dir, isa)]
        lib = None
        compiler = shutil.which("gcc")
        if isa not in supported_isas():
            missing = sorted(REQUIRED_CPU_FLAGS[isa] - cpu_flags()) or platform.machine()
            log.info("the engine's %s kernels are not used: the CPU lacks %s", isa, missing)
        elif compiler is None:
            log.warning("the engine's CPU kernels are not used: no gcc to build them (torch's kernels run instead)")
        else:
            target = cache_dir / "kernels" / _build_name(isa, compiler)
            try:
                if not target.exists():
                    compile_library(isa, target, compiler)
                    _remove_older_builds(target, isa)
                lib = ctypes.CDLL(str(target))
                for name, argtypes in SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or exc
                log.warning("the engine's %s kernels are not used: building them failed: %s", isa, detail)
                lib = None
        _loaded[(cache_dir, isa)] = lib
        return lib
