"""Fixtures for the LLM engine tests: the embedded SmolLM2 model, loaded once per session.

The GGUF -> safetensors conversion happens once, into GATEWAY_CACHE_DIR (default
~/.cache/realtime-gateway); later sessions load the converted copy in about a second.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from inference.llm import cpu_kernels
from inference.llm.backend import GenerationResult, SamplingParams
from inference.llm.engine import EngineConfig, LLMEngine
from inference.llm.loader import LoadedLM, load_lm
from inference.models import ModelNotFound, embedded_llm


def cache_dir() -> Path:
    return Path(os.environ.get("GATEWAY_CACHE_DIR") or "~/.cache/realtime-gateway").expanduser()


@pytest.fixture(scope="session")
def gateway_cache_dir() -> Path:
    return cache_dir()


@pytest.fixture(scope="session", params=cpu_kernels.ISAS)
def kernels(request: pytest.FixtureRequest, gateway_cache_dir: Path) -> ctypes.CDLL:
    """The engine's C kernel library (inference/llm/cpu_kernels.py), once per build: a test that takes
    it runs on each build this CPU runs."""
    isa = request.param
    if isa not in cpu_kernels.supported_isas():
        missing = sorted(cpu_kernels.REQUIRED_CPU_FLAGS[isa] - cpu_kernels.cpu_flags())
        pytest.skip(f"this CPU cannot run the {isa} build (it lacks {', '.join(missing) or 'x86-64'})")
    built = cpu_kernels.load(gateway_cache_dir, isa)
    if built is None:
        pytest.skip(f"the {isa} build could not be made (no gcc? see the log): the engine runs torch's kernels")
    return built


@pytest.fixture(scope="session")
def lm() -> LoadedLM:
    try:
        path = embedded_llm()
    except ModelNotFound as exc:  # pragma: no cover - depends on the machine
        pytest.skip(str(exc))
    # float32 on purpose: these tests hold the engine to generate()'s exact tokens ("auto" on a CPU
    # runs this Q4_1 model's weights as int4, which test_int4_weights_engine covers).
    return load_lm(path, cache_dir=cache_dir(), dtype="float32", max_context_tokens=4096)


@pytest.fixture
def make_engine(lm):
    engines: list[LLMEngine] = []

    def make(start: bool = True, **config) -> LLMEngine:
        eng = LLMEngine(lm, EngineConfig(**config))
        if start:
            eng.start()
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


@pytest.fixture
def chat_ids(lm):
    def render(*turns: tuple[str, str], system: str | None = None, generation_prompt: bool = True) -> list[int]:
        msgs = [{"role": "system", "content": system}] if system else []
        msgs += [{"role": role, "content": content} for role, content in turns]
        out = lm.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=generation_prompt, tokenize=True, return_dict=True
        )
        return list(out["input_ids"])

    return render


GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=20)


@pytest.fixture
def collect():
    async def run(engine: LLMEngine, ids, params: SamplingParams = GREEDY, **kw) -> GenerationResult:
        """Run one request to the end; checks that the streamed deltas add up to the result's text."""
        stream = engine.submit(ids, params, **kw)
        deltas = [d async for d in stream]
        result = await stream.result()
        assert "".join(deltas) == result.text
        return result

    return run
