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
    gpu.main(["--device", device, "--layers", "2", "--tokens", "8", "--repeats", "1"])
    report = json.loads(capsys.readouterr().out)
    assert report["weights"] == "random" and report["layers"] == 2 and report["shape"] == "smollm2-135m"
    assert report["paths"]["device"] == device
    assert report["paths"]["decode"] == ("cuda-graphs" if device == "cuda" else "eager")
    assert report["1_ttft"]["prompt_tokens"] >= 740
    assert report["1_ttft"]["cached_prompt_tokens_second"] > 700  # the system prompt was reused
    streams = report["2_streams"]
    assert [streams[f"streams_{n}"]["tokens"] for n in (1, 8, 32)] == [8, 8 * 8, 32 * 8]
    versus = report["3_versus_transformers"]
    assert versus["generate_1_stream_tok_s"] > 0 and versus["continuous_batching_8_streams_tok_s"] > 0
    assert versus["ratio_8_streams_vs_generate"] > 0 and not versus["continuous_batching_errors"]
    assert len(report["4_batched_equals_solo"]["leading_tokens_equal"]) == 8
    if device == "cuda":
        assert report["memory_bound"]["one_stream_tok_s"] > 0 and report["engine_stats"]["graph_replays"] > 0
