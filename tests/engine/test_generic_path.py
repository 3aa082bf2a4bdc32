"""The forward's correctness under batching on every path, with random weights of the embedded model's
shape (no weight file needed, so the same tests run on a GPU machine).

- float64: torch's generic path (sdpa over padded, masked slots) gives a request the same logits alone
  and batched, and the same as transformers' own forward. Rounding is negligible there, so any
  difference is a defect: a wrong mask, position or slot (the test shows it catches a shifted position).
- float32, bfloat16, int8 and int4 on torch's kernels: the same comparison within a stated bound. Those
  paths round differently for different row counts: on this CPU, row by row matmuls left bfloat16's
  differences only in the steps whose decoding rows share sdpa's padded call, so both torch's GEMMs
  (kernels picked by the number of rows) and sdpa (blocks over the padded length) contribute. In
  float64 both are exact, so it is rounding, not a defect. The bound is a few units in the last place
  of the format at the logits' scale, and greedy tokens must agree wherever the solo run's top two
  logits are further apart than twice the bound.
- int4 on the engine's kernels (each build this CPU runs): bit for bit, whatever the batch.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.synthetic_lm import SHAPES, random_model
from inference.llm import cpu_kernels
from inference.llm.forward import LeanForward
from inference.llm.model_support import UnsupportedModel
from tests.engine.batching import Workload, reference_logits, run_batched, run_solo, with_clear_steps

LAYERS = 4
_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
# The CPU runs the embedded model's shape; a GPU every shape the benchmark runs (4 of their layers).
DEVICES = [pytest.param("cpu", "smollm2-135m", id="cpu")] + [
    pytest.param("cuda", shape, marks=_CUDA, id=f"cuda-{shape}") for shape in SHAPES]
# (weight format, model dtype, relative bound on |solo - batched| against the largest |logit|)
ROUNDING_PATHS = [
    ("native", torch.float32, 2**-14),  # measured 1.2e-6 relative on this CPU
    ("native", torch.bfloat16, 2**-5),  # measured 2^-7 (one bfloat16 unit at the logits' scale)
    pytest.param("native", torch.float16, 2**-5, marks=_CUDA),  # float16 GEMMs are a GPU's, not a CPU's
    ("int8", torch.float32, 2**-5),  # bfloat16 activations: measured 2^-7
    ("int4", torch.float32, 2**-5),  # torch's kernel, bfloat16 inputs and outputs: measured 2^-8
]


def _forward(model, weight_format: str, kernels: str, tmp_path) -> LeanForward:
    try:
        return LeanForward(model, 2048, weight_format=weight_format, kernel_dir=tmp_path, kernels=kernels)
    except UnsupportedModel as exc:  # a format the device's torch build lacks (int4 and int8 off the CPU)
        pytest.skip(str(exc))


@pytest.mark.parametrize(("device", "shape"), DEVICES)
def test_float64_generic_path_is_exact_and_matches_transformers(device, shape, tmp_path):
    model = random_model(LAYERS, torch.float64, device, shape=shape)
    fwd = _forward(model, "native", "torch", tmp_path)
    assert fwd.describe()["attention"] == "sdpa"
    work = Workload.random(fwd.vocab_size)
    batched = run_batched(fwd, work)
    for i in range(len(work.prompts)):
        solo = run_solo(fwd, work, i)
        scale = solo.abs().max().item()
        assert (batched[i] - solo).abs().max().item() <= 1e-9 * scale, i
        assert (reference_logits(model, work, i) - solo).abs().max().item() <= 1e-9 * scale, i
    # The comparison sees a defect: one request's positions shifted by one in the batched run.
    shifted = run_batched(fwd, work, position_offset=1)
    solo = run_solo(fwd, work, 1)
    assert (shifted[1][1:] - solo[1:]).abs().max().item() > 1e-3 * solo.abs().max().item()


def test_float64_bound_leaves_room_for_kernels_chosen_by_row_count(monkeypatch, tmp_path):
    """On this CPU a request's float64 rows come out bit for bit the same alone and batched; cuBLAS picks
    other GEMM kernels for other row counts, so on a GPU they differ in their last bits. The 1e-9 bound
    holds that only while the logits stay float64: rounded to float32, such a difference becomes a
    float32 unit (6e-8 of a logit) wherever it crosses a rounding boundary. Here the batched steps'
    head differs by 1e-11 relative, as another kernel's sums would."""
    fwd = _forward(random_model(LAYERS, torch.float64), "native", "torch", tmp_path)
    head = fwd._lin_head
    monkeypatch.setattr(fwd, "_lin_head", lambda x, w: head(x, w) * (1 + 1e-11) if x.shape[0] > 1 else head(x, w))
    work = Workload.random(fwd.vocab_size)
    batched = run_batched(fwd, work)
    for i in range(len(work.prompts)):
        solo = run_solo(fwd, work, i)
        scale = solo.abs().max().item()
        assert 0 < (batched[i] - solo).abs().max().item() <= 1e-9 * scale, i
        assert solo.dtype == batched[i].dtype == torch.float64


@pytest.mark.parametrize(("device", "shape"), DEVICES)
@pytest.mark.parametrize(("weight_format", "dtype", "bound"), ROUNDING_PATHS)
def test_generic_path_rounding_is_bounded(device, shape, weight_format, dtype, bound, tmp_path):
    _assert_rounding_is_bounded(_forward(random_model(LAYERS, dtype, device, shape=shape), weight_format, "torch",
                                         tmp_path), bound)


def test_rounding_check_compares_tokens_over_a_large_vocabulary(tmp_path):
    """The check above over the 1.5B shape at bfloat16's bound (the GPU runs every shape in bfloat16): over its
    151936-token vocabulary, random tokens gave 8 clear steps of 44, too few to compare tokens on. Which steps
    are clear depends on the bound, not on the weights' type, so the CPU runs float32 weights: bfloat16
    GEMMs of that head took over 15 minutes with the AVX2 paths forced and two other processes on the cores
    (an AMD host has no bfloat16 instructions), against 25 s with AMX."""
    _assert_rounding_is_bounded(_forward(random_model(LAYERS, torch.float32, shape="qwen2.5-1.5b"), "native",
                                         "torch", tmp_path), 2**-5)


def _assert_rounding_is_bounded(fwd: LeanForward, bound: float) -> None:
    """Each request's logits alone and batched within ``bound`` of their scale, and the same greedy
    tokens wherever the solo run's top two logits are further apart than twice that."""
    work = with_clear_steps(fwd, Workload.random(fwd.vocab_size), bound)
    batched = run_batched(fwd, work)
    compared = 0
    for i in range(len(work.prompts)):
        solo = run_solo(fwd, work, i)
        limit = bound * solo.abs().max().item()
        assert (batched[i] - solo).abs().max().item() <= limit, (i, (batched[i] - solo).abs().max().item(), limit)
        top2 = solo.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * limit  # no near-tie: the greedy token cannot flip
        assert torch.equal(solo.argmax(-1)[clear], batched[i].argmax(-1)[clear]), i
        compared += int(clear.sum())
    # Random weights give flat logits (the top two of the vocabulary's draws are close); the tokens
    # were picked for clear steps (with_clear_steps), so at least half of them must have been compared.
    assert compared >= sum(len(f) + 1 for f in work.feeds) // 2, compared


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
def test_int4_on_the_engines_kernels_is_bit_identical_batched(isa, tmp_path):
    if isa not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU does not run the {isa} build")
    model = random_model(LAYERS, torch.float32)
    fwd = _forward(model, "int4", isa, tmp_path)
    assert fwd.describe()["matmul"] == isa and fwd.describe()["attention"] == isa
    work = Workload.random(fwd.vocab_size)
    batched = run_batched(fwd, work)
    for i in range(len(work.prompts)):
        assert torch.equal(batched[i], run_solo(fwd, work, i)), i


def test_bfloat16_on_the_cpu_says_whether_the_cpu_computes_it(monkeypatch, tmp_path):
    """A CPU without bfloat16 instructions emulates them (a decode step of the embedded model took about 2 s on an
    AVX2-only Zen 3): /healthz's llm.bfloat16 and the log say so instead of running slower silently. Both answers
    are checked on every host, the CPU's flags stood in for."""
    assert cpu_kernels.has_bfloat16_instructions(frozenset({"avx2", "amx_bf16"}))
    assert not cpu_kernels.has_bfloat16_instructions(frozenset({"avx2", "avx512f", "avx512_vnni"}))
    bf16 = _forward(random_model(1, torch.bfloat16, "cpu", vocab=512), "native", "torch", tmp_path)
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))  # a Zen 3
    assert bf16.describe()["bfloat16"].startswith("emulated: ")
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert bf16.describe()["bfloat16"] == "native"
    fp32 = _forward(random_model(1, torch.float32, "cpu", vocab=512), "native", "torch", tmp_path)
    assert "bfloat16" not in fp32.describe()
