"""The two builds of the engine's C kernels side by side, for the tests that hold the AVX2 build to the
VNNI build's bits (inference/llm/simd.h: the same IEEE operations per lane, in the same order)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from inference.llm import cpu_kernels


def vnni_and_avx2(cache_dir: Path) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """Both builds, or a skip where this CPU cannot run the VNNI one (an AVX512-VNNI CPU runs both)."""
    if "vnni" not in cpu_kernels.supported_isas():
        pytest.skip("this CPU lacks AVX512-VNNI: there is no VNNI build to hold the AVX2 build to")
    vnni, avx2 = cpu_kernels.load(cache_dir, "vnni"), cpu_kernels.load(cache_dir, "avx2")
    if vnni is None or avx2 is None:
        pytest.skip("the kernels could not be built here (no gcc? see the log)")
    return vnni, avx2


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal as bit patterns (so -0.0 is not 0.0), float32 or float16."""
    assert got.dtype == want.dtype and got.shape == want.shape
    as_int = torch.int32 if got.dtype == torch.float32 else torch.int16
    differ = got.contiguous().view(as_int) != want.contiguous().view(as_int)
    assert not differ.any(), f"{int(differ.sum())} of {differ.numel()} values differ, first at {differ.nonzero()[0].tolist()}"
