"""--llm-kernels: which kernels a CPU forward runs, and a build the CPU cannot run refused, not ignored."""

from __future__ import annotations

import pytest

from gateway.platform.config import LlmKernels
from inference.llm import cpu_kernels, forward
from inference.llm.kernel_paths import KERNEL_CHOICES, resolve_kernels
from inference.llm.model_support import UnsupportedModel


@pytest.mark.parametrize(("runs", "requested", "expected"), [
    (("vnni", "avx2"), "auto", "vnni"),
    (("avx2",), "auto", "avx2"),
    ((), "auto", "torch"),
    (("vnni", "avx2"), "avx2", "avx2"),
    (("avx2",), "torch", "torch"),
    ((), "torch", "torch"),
])
def test_resolve(monkeypatch, runs, requested, expected):
    monkeypatch.setattr(cpu_kernels, "supported_isas", lambda: runs)
    assert resolve_kernels(requested) == expected


@pytest.mark.parametrize(("runs", "requested"), [(("avx2",), "vnni"), ((), "avx2"), ((), "vnni")])
def test_a_build_the_cpu_cannot_run_is_refused(monkeypatch, runs, requested):
    monkeypatch.setattr(cpu_kernels, "supported_isas", lambda: runs)
    with pytest.raises(UnsupportedModel, match=f"{requested} kernels need a CPU with {requested.upper()}"):
        resolve_kernels(requested)


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve_kernels("sse2")


def test_the_setting_offers_exactly_the_forwards_choices():
    assert set(LlmKernels.__args__) == set(KERNEL_CHOICES) == {"auto", *cpu_kernels.ISAS, "torch"}


def test_load_lm_refuses_before_loading(monkeypatch, tmp_path):
    from inference.llm.loader import load_lm

    monkeypatch.setattr(cpu_kernels, "supported_isas", lambda: ())
    monkeypatch.setattr(forward.cpu_kernels, "supported_isas", lambda: ())
    with pytest.raises(UnsupportedModel):
        load_lm(tmp_path / "no-such-model", cache_dir=tmp_path, kernels="avx2")  # refused before the missing file


def test_a_cpu_build_is_refused_off_the_cpu():
    from benchmarks.synthetic_lm import random_model
    from inference.llm.forward import LeanForward

    model = random_model(1, device="meta")  # no memory: the check comes before any weight is touched
    with pytest.raises(UnsupportedModel, match="run on a CPU, not on meta"):
        LeanForward(model, 64, kernels="avx2")
