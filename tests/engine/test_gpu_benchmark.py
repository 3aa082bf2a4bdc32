"""benchmarks/gpu.py runs its sections end to end: on the CPU here (two random layers, a few tokens,
so that the script cannot rot where no GPU is), and in full on CUDA where one is present."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_gpu_benchmark_runs_on_random_weights(device, capsys):
    gpu.main(["--device", device, "--layers", "2", "--tokens", "8", "--repeats", "1", "--pairs", "1"])
    report = json.loads(capsys.readouterr().out)
    assert report["weights"] == "random" and report["layers"] == 2
    assert report["paths"]["device"] == device
    assert report["1_system_prompt_ttft"]["cached_prompt_tokens_second"] > 500  # the system prompt was reused
    assert report["2_concurrency"]["eight_streams"]["tokens"] == 8 * 8
    versus = report["3_transformers_continuous_batching"]
    assert versus["engine_aggregate_tok_s"] > 0 and versus["transformers_continuous_batching_tok_s"] > 0
    assert not versus["transformers_errors"]
    # Identical seeded copies: the engine's greedy tokens are transformers' (float32 on a CPU).
    if device == "cpu":
        assert versus["streams_with_identical_greedy_tokens"] == "8/8"
