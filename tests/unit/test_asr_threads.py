"""CTranslate2's OpenMP runtime starts with the ASR's threads, not every core (inference/asr.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes, glob, os, sys
    os.environ.pop("OMP_NUM_THREADS", None)
    from inference.asr import import_ctranslate2
    ctranslate2 = import_ctranslate2(THREADS)
    assert "OMP_NUM_THREADS" not in os.environ, "the variable was not put back"
    libs = os.path.join(os.path.dirname(os.path.dirname(ctranslate2.__file__)), "ctranslate2.libs")
    gomp = glob.glob(os.path.join(libs, "libgomp*")) or glob.glob(os.path.join(os.path.dirname(ctranslate2.__file__), "*gomp*"))
    # dlopen of the loaded file gives the copy CTranslate2 uses; its global thread count is what OMP_NUM_THREADS set
    print(ctypes.CDLL(gomp[0]).omp_get_max_threads() if gomp else "no-gomp")
""")


def _max_threads(threads: int) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE.replace("THREADS", str(threads))], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_ctranslate2_openmp_runs_on_the_asr_threads() -> None:
    one = _max_threads(1)
    if one == "no-gomp":
        pytest.skip("this CTranslate2 build carries no libgomp of its own")
    assert one == "1"
    assert _max_threads(3) == "3"
