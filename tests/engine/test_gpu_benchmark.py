"""benchmarks/gpu.py runs its sections end to end: on the CPU here (two random layers, a few tokens,
so that the script cannot rot where no GPU is), and in full on CUDA where one is present. Each section
is a JSON line as soon as it exists; one that raises is recorded and the others still run."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import gpu

SMALL = ["--layers", "2", "--tokens", "8", "--repeats", "1"]
GPU_CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


def _sections(text: str) -> dict[str, dict]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(set(line) in ({"shape", "section", "result"}, {"shape", "section", "error"}) for line in lines)
    return {line["section"]: line for line in lines}


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_gpu_benchmark_runs_on_random_weights(device, capsys):
    assert gpu.main(["--device", device, *SMALL]) == 0
    lines = _sections(capsys.readouterr().out)
    assert list(lines) == ["setup", "capture", "1_ttft", "2_streams", "4_batched_equals_solo", "engine_stats",
                           "3_versus_transformers"]  # transformers' comparison last
    report = {name: line["result"] for name, line in lines.items()}
    setup = report["setup"]
    assert setup["weights"] == "random" and setup["layers"] == 2 and lines["setup"]["shape"] == "smollm2-135m"
    assert setup["paths"]["device"] == device
    # The CPU runs the path CUDA replays (the static buffers), uncaptured.
    assert setup["paths"]["decode"] == ("cuda-graphs" if device == "cuda" else "static")
    assert setup["paths"]["overlap"] == "on"  # the CPU's run takes the GPU's path
    capture = report["capture"]
    if device == "cuda":
        assert capture["captured"] == len(capture["batch_buckets"]) * len(capture["length_buckets"])
        assert capture["failed"] == 0 and capture["capture_s"] > 0
    else:
        assert capture["captured"] == 0 and capture["length_buckets"] == []
    assert report["1_ttft"]["prompt_tokens"] >= 740
    assert report["1_ttft"]["cached_prompt_tokens_second"] > 700  # the system prompt was reused
    streams = report["2_streams"]
    assert [streams[f"streams_{n}"]["tokens"] for n in (1, 8, 32)] == [8, 8 * 8, 32 * 8]
    versus = report["3_versus_transformers"]
    assert versus["generate_1_stream_tok_s"] > 0 and versus["continuous_batching_8_streams_tok_s"] > 0
    assert versus["ratio_8_streams_vs_generate"] > 0 and not versus["continuous_batching_errors"]
    assert len(report["4_batched_equals_solo"]["leading_tokens_equal"]) == 8
    if device == "cuda":
        assert setup["memory_bound"]["one_stream_tok_s"] > 0 and report["engine_stats"]["graph_replays"] > 0


def test_step_sections_and_each_line_as_it_comes(tmp_path, capsys, monkeypatch):
    """What benchmarks/gpu_check.sh asks of the 1.5B shape, on the CPU: the kernels of a step, steps of
    two buckets against the engine's, the prefill forward against TTFT; each line is in ``--out`` as soon
    as its section ends, and a section that raises is recorded while the next ones run."""
    written_before_prefill = []
    real_prefill = gpu.prefill_section

    async def prefill(engine, repeats):
        written_before_prefill.extend((tmp_path / "gpu-smollm2-135m.jsonl").read_text().splitlines())
        return await real_prefill(engine, repeats)

    monkeypatch.setattr(gpu, "prefill_section", prefill)

    async def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu, "bench_system_prompt", broken)
    status = gpu.main(["--device", "cpu", *SMALL, "--sections", "ttft,prefill,steps,kernels,capture",
                       "--buckets", "1x64,2x128", "--out", str(tmp_path)])
    assert status == 1  # an engine section failed
    lines = _sections(capsys.readouterr().out)
    assert list(lines) == ["setup", "capture", "kernels", "steps", "prefill", "1_ttft", "engine_stats"]
    assert [json.loads(line)["section"] for line in written_before_prefill] == ["setup", "capture", "kernels", "steps"]
    assert lines["1_ttft"]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    on_file = _sections((tmp_path / "gpu-smollm2-135m.jsonl").read_text())
    assert on_file == lines
    kernels = lines["kernels"]["result"]
    assert [(k["batch"], k["length"]) for k in kernels] == [(1, 64), (2, 128)]
    assert all(k["aten_ops"]["per_layer"] > 0 and k["aten_ops"]["outside_layers"] > 0 for k in kernels)
    steps = lines["steps"]["result"]
    for row, (batch, length) in zip(steps, [(1, 64), (2, 128)]):
        assert (row["batch"], row["length"], row["graph_replay"]) == (batch, length, False)
        assert row["step"]["median_ms"] > 0 and row["step"]["runs"] == gpu.TIMED_RUNS
        assert row["kernels_one_step"] == kernels[[(1, 64), (2, 128)].index((batch, length))]["aten_ops"]["per_step"]
        assert row["engine"]["steps"] > 0 and row["engine"]["step_ms"] > 0
    prefill_result = lines["prefill"]["result"]
    assert prefill_result["prompt_tokens"] == gpu.PROMPT_TOKENS
    assert prefill_result["forward"]["median_ms"] > 0 and prefill_result["ttft"]["median_ms"] > 0


def test_a_failed_transformers_comparison_is_recorded_not_fatal(tmp_path, capsys, monkeypatch):
    """It runs last, from the engine's streams of an earlier run in the same --out folder."""
    assert gpu.main(["--device", "cpu", *SMALL, "--sections", "streams", "--out", str(tmp_path)]) == 0
    streams = _sections(capsys.readouterr().out)["2_streams"]["result"]

    def broken(stock, prompts, tokens):
        raise RuntimeError("generate_batch ran out of memory")

    monkeypatch.setattr(gpu, "transformers_batch", broken)
    assert gpu.main(["--device", "cpu", *SMALL, "--sections", "transformers", "--out", str(tmp_path)]) == 0
    lines = _sections(capsys.readouterr().out)
    assert list(lines) == ["setup", "3_versus_transformers"]
    assert "ran out of memory" in lines["3_versus_transformers"]["error"]
    monkeypatch.undo()
    assert gpu.main(["--device", "cpu", *SMALL, "--sections", "transformers", "--out", str(tmp_path)]) == 0
    versus = _sections(capsys.readouterr().out)["3_versus_transformers"]["result"]
    # Both figures are rounded where the ratio is not: they agree to within the rounding.
    assert versus["ratio_8_streams_vs_generate"] == pytest.approx(
        streams["streams_8"]["aggregate_tok_s"] / versus["generate_8_streams_tok_s"], rel=0.02, abs=0.011)


def test_gpu_check_calls_the_benchmark_with_arguments_it_takes():
    """benchmarks/gpu_check.sh runs where it cannot be tried first: each of its benchmarks.gpu command
    lines parses here (sections and buckets included)."""
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True).returncode == 0
    script = GPU_CHECK.read_text().replace("\\\n", " ")  # continued lines joined
    calls = re.findall(r"-m benchmarks\.gpu ([^\n>|&]*)", script)
    assert len(calls) >= 3, calls
    for call in calls:
        args = [a for a in shlex.split(call.replace("$out", "/tmp/out")) if not a.startswith("$")]
        parsed = gpu.build_parser().parse_args(args)
        assert parsed.out is not None, call  # every section's line lands in the output folder


def test_a_vocabulary_without_room_for_the_bytes_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu.build_parser().parse_args(["--vocab", "258"])
    assert "no room for the 256 bytes" in capsys.readouterr().err


def test_host_section_reports_the_host_time_per_step(capsys):
    """The host section times the engine's decoding steps of each batch, with the model's forward and
    with the stub that returns fixed logits, with steps overlapped and without; every part it reports is
    a time, the host's below the step's; overlapped, the tokens accepted behind the next step's launch are
    the part of it the device would not wait for."""
    assert gpu.main(["--device", "cpu", "--layers", "2", "--sections", "host", "--tokens", "8",
                     "--host-batches", "1,4", "--vocab", "512"]) == 0
    sections = _sections(capsys.readouterr().out)
    assert sections["setup"]["result"]["vocab"] == 512
    report = sections["host"]["result"]
    assert [(r["forward"], r["overlapped"], r["batch"]) for r in report] == [
        (forward, overlapped, batch) for forward in ("model", "stub") for overlapped in (False, True) for batch in (1, 4)]
    for row in report:
        assert row["steps"] >= 5, row
        assert 0 < row["host_ms"] < row["step_ms"] and row["forward_ms"] > 0
        # Every step of these greedy rows is sampled on the device, in the sampler's step a graph captures.
        assert min(row["device_sampling_ms"], row["runner_host_ms"], row["rest_ms"]) > 0
        if row["overlapped"]:
            assert row["accept_overlapped_ms"] > 0 and 0 < row["exposed_host_ms"] < row["host_ms"], row
        else:
            assert row["accept_overlapped_ms"] == 0 and row["exposed_host_ms"] == row["host_ms"], row
