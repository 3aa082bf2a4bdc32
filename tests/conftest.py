"""Real models shared by every test package, loaded once per session: Whisper tiny.en and the Piper voice."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from inference.asr import AsrEngine
from inference.models import embedded_asr, embedded_tts
from inference.tts import TtsEngine
from media.resample import resample

QUESTION = "What is the capital of France?"

# Admission by measured capacity refuses new sessions while voice turns run slow: on a loaded test machine that
# says nothing about the test at hand, so every gateway of the suite (in process or started by it) has no bound,
# but those of tests/integration/test_admission.py, which set their own.
os.environ.setdefault("GATEWAY_ADMISSION_LATENCY_MS", "0")


@pytest.fixture(scope="session")
def asr() -> Iterator[AsrEngine]:
    # Every partial runs: the tests of partials are about their words and order (the budget has its own tests).
    engine = AsrEngine.load(embedded_asr(), "cpu", threads=2, partial_budget=64)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tts() -> Iterator[TtsEngine]:
    engine = TtsEngine.load(embedded_tts(), threads=1, variation=False)  # the same question every run
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def question_pcm(tts: TtsEngine) -> np.ndarray:
    """Piper saying the question, int16 at the voice's rate (22050 Hz)."""
    return tts.synthesize_blocking(QUESTION)


@pytest.fixture(scope="session")
def question_16k(tts: TtsEngine, question_pcm: np.ndarray) -> np.ndarray:
    return resample(question_pcm, tts.sample_rate, 16000)


# -- which LLM kernel paths this run tested (issue: CI tests the path its machine runs) ----------------------
KERNEL_PATHS = ("vnni", "avx2", "torch")
_kernel_passed: dict[str, int] = dict.fromkeys(KERNEL_PATHS, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        paths = sorted(v for k, v in params.items() if k in ("isa", "kernels") and v in KERNEL_PATHS)
        if paths:  # on the report, which pytest-xdist's workers send to the process that sums them up
            item.user_properties.append(("kernel_paths", ",".join(paths)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        for path in dict(report.user_properties).get("kernel_paths", "").split(","):
            if path:
                _kernel_passed[path] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    import platform

    from inference.llm import cpu_kernels

    model = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    runs = ", ".join(cpu_kernels.supported_isas()) or "none of the engine's builds"
    ran = ", ".join(f"{path}: {n} passed" for path, n in _kernel_passed.items())
    terminalreporter.write_line(f"LLM kernel paths on {model} (runs {runs}): {ran}")
