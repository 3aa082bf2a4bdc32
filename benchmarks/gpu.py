"""The LLM engine on a GPU, section by section, against transformers' own ``generate`` and continuous
batching last; each section's result is one JSON line, printed (and appended to ``--out``) as soon as
it exists, so that a section that fails or a run cut short keeps what came before.

    python -m benchmarks.gpu [--shape qwen2.5-1.5b] [--sections capture,ttft,...] [--out DIR]
    python -m benchmarks.gpu --count-kernels       # kernels of one decoding step, per layer

``--weights random`` (the default) builds a model of ``--shape`` (``benchmarks/synthetic_lm.py``:
smollm2-135m, qwen2.5-1.5b, llama-3.2-3b, qwen2.5-7b) with seeded random weights and a byte-level
tokenizer, so that a GPU machine needs no weight file; speed does not depend on the weights' values.
``--weights embedded`` loads the embedded SmolLM2 instead.

Sections (``--sections``, in this order whatever the order given; the default is marked *):

- ``setup`` (always): device, shape, layers, dtype, the memory bound (the weights read once a step
  at ``--bandwidth-gbs``) and what each part of a step runs on (``paths``);
- ``capture`` *: the CUDA graphs the engine captured when it started, the seconds and memory that
  took, and any that failed (``ModelRunner.capture_report``);
- ``kernels``: the kernels one decoding step issues (``decode_static``, the step a graph captures),
  per step and per layer: on CUDA the profiler's device kernels, elsewhere the aten operations that
  launch one (``--count-kernels`` runs this section alone);
- ``steps``: for each ``--buckets`` (batch x length), one step replayed (the captured graph on CUDA),
  timed with CUDA events, with the kernels the profiler sees in one replay, against the engine's own
  step at that batch and context (its decoding steps while every stream decodes);
- ``host``: the engine's host time per decoding step at 1, 8 and 32 streams (``--host-batches``), with
  the model's forward and with a stub returning fixed logits (the host's caches as beside a GPU):
  the step's wall time (scheduling, staging, the forward, sampling, detokenizing, delivery) less what
  a GPU replays as captured graphs (the forward, ``decode_static``, and the sampler's step,
  ``DeviceSampler.run``, each timed inside the step), split into the runner's staging and the sampler's
  bookkeeping, and the rest; greedy with ``--host-repetition-penalty`` (the gateway's default 1.1),
  overlapped and not. On the CPU the graphs' work runs uncaptured and synchronously, and is reported
  beside (``forward_ms``, ``device_sampling_ms``); ``--vocab 512`` leaves the host's own work without
  the vocabulary-wide arithmetic in between, which a GPU does; on CUDA the host time also holds the wait
  for the device at the step's one synchronization;
- ``prefill``: the forward alone over a 762-token prompt against the engine's TTFT of it (cold);
- ``1_ttft`` *: TTFT of a ~762-token prompt (a system prompt and a question) seen for the first
  time, and of the same system prompt with another question (the prefix cache);
- ``2_streams`` *: aggregate tok/s of 1, 8 and 32 concurrent greedy streams (medians of
  ``--repeats``), with each one's share of the memory bound;
- ``4_batched_equals_solo`` *: each of 8 streams' greedy tokens batched against the same prompt alone:
  how many leading tokens agree (random weights give flat logits, so a near-tie, where rounding may
  pick the other token, comes early; ``tests/engine`` checks the logits themselves);
- ``3_versus_transformers`` * (last, and its failure is recorded, not fatal): 1 and 8 streams on
  transformers' ``generate`` (8 prompts of equal length in one padded batch) and 8 on its
  ContinuousBatchingManager (``generate_batch``), on an identical copy of the model, with the
  engine's ratio to each (from ``2_streams`` of this run, or of an earlier one in ``--out``).

Each line is ``{"shape", "section", "result"}`` or, where the section raised, ``{"shape", "section",
"error"}``; the exit status is 1 if an engine section failed. ``--device cpu`` runs the same sections
on the CPU through the path CUDA replays (torch's kernels, the static decoding buffers, uncaptured;
timed with the host's clock): the test suite does, with two layers, so that the script stays working
where no GPU is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine import (
    LONG_QUESTIONS,
    bench_system_prompt,
    leading_agreement,
    render,
    run_streams,
    running,
    transformers_batch,
    ttft,
    warm_up,
)
from benchmarks.synthetic_lm import SHAPES, random_loaded_lm
from inference.llm.backend import SamplingParams
from inference.llm.engine import GRAPH_LENGTH_AT_START, EngineConfig, LLMEngine
from inference.llm.forward import LeanForward
from inference.llm.kv_manager import KVPool
from inference.llm.loader import LoadedLM, load_lm
from inference.llm.model_runner import length_buckets
from inference.llm.step_plan import Segment
from inference.llm.threads import run_in_own_thread
from inference.models import embedded_llm

H100_SXM_GBS = 3350.0  # HBM3 bandwidth of an H100 SXM (80 GB)
PROMPT_TOKENS = 762
ENGINE_SECTIONS = ("capture", "kernels", "steps", "host", "prefill", "1_ttft", "2_streams", "4_batched_equals_solo")
SECTIONS = (*ENGINE_SECTIONS, "3_versus_transformers")
SHORT_NAMES = {"ttft": "1_ttft", "streams": "2_streams", "solo": "4_batched_equals_solo",
               "transformers": "3_versus_transformers"}
DEFAULT_SECTIONS = "capture,ttft,streams,solo,transformers"
DEFAULT_BUCKETS = "1x256,8x256,32x256,1x1024"
TIMED_RUNS = 20


# -- output ------------------------------------------------------------------------------------------------
class Emitter:
    """One JSON line per section, to stdout and appended to ``<out>/gpu-<shape>.jsonl``, flushed as
    each is written; remembers the results for the sections after it."""

    def __init__(self, shape: str, out: Path | None) -> None:
        self.shape = shape
        self.results: dict[str, Any] = {}
        self.failed: list[str] = []
        self.path = None if out is None else out / f"gpu-{shape}.jsonl"
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def emit(self, section: str, result: Any = None, error: BaseException | None = None) -> None:
        line: dict[str, Any] = {"shape": self.shape, "section": section}
        if error is None:
            line["result"] = result
            self.results[section] = result
        else:
            line["error"] = f"{type(error).__name__}: {error}"[:2000]
            self.failed.append(section)
        text = json.dumps(line)
        print(text, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(text + "\n")
                f.flush()
                os.fsync(f.fileno())

    def earlier(self, section: str) -> Any:
        """This section's result from this run, else from the last run in the same ``--out`` file."""
        if section in self.results:
            return self.results[section]
        if self.path is None or not self.path.exists():
            return None
        found = None
        for text in self.path.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if line.get("section") == section and "result" in line:
                found = line["result"]
        return found


# -- measurement helpers -----------------------------------------------------------------------------------
def _cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def time_calls(fn: Callable[[], object], device: torch.device, runs: int = TIMED_RUNS) -> list[float]:
    """Milliseconds of each of ``runs`` calls after one warm-up: CUDA events around each on a GPU (the
    device's time, not the launch's), the host's clock elsewhere."""
    fn()
    out = []
    if _cuda(device):
        torch.cuda.synchronize(device)
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    else:
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _summary_ms(times: list[float]) -> dict:
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4), "runs": len(times)}


# aten operations that launch nothing: views, allocations, metadata. (On a GPU, an op that launches a kernel
# launches one or a few; the profiler's device events count those exactly.)
_NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "empty", "empty_strided", "empty_like", "as_strided", "view", "_unsafe_view", "_reshape_alias", "slice",
    "select", "unsqueeze", "squeeze", "expand", "expand_as", "t", "transpose", "permute", "detach", "alias",
    "resolve_conj", "resolve_neg", "result_type", "resize_", "narrow", "lift_fresh", "view_as", "unflatten",
    "split", "split_with_sizes", "chunk", "unbind", "view_as_real", "view_as_complex", "diagonal"))
# Ops that are views or copies depending on their input: a copy where something under them launches.
_MAYBE_COPY = frozenset(f"aten::{n}" for n in ("to", "reshape", "contiguous", "flatten", "type_as"))


def _launches(event) -> int:
    name = event.name
    inner = sum(_launches(c) for c in event.cpu_children)
    if not name.startswith("aten::") or name in _NO_KERNEL:
        return inner
    if name in _MAYBE_COPY:
        return min(inner, 1)
    return 1  # one operation, one kernel (a composite one, such as a CPU's rms_norm, counts once)


def aten_launches(fn: Callable[[], object]) -> int:
    """The aten operations ``fn`` dispatches that launch a kernel (outermost ones; views and
    allocations left out), from torch.profiler's CPU events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(_launches(e) for e in prof.events() if e.cpu_parent is None)


def device_kernels(fn: Callable[[], object], device: torch.device) -> int:
    """The kernels (and memory copies and sets) the GPU runs for ``fn``, from torch.profiler's device
    events (kernels inside a replayed graph are the device's too)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def decode_step_kernels(fwd: LeanForward, batch: int, length: int) -> dict:
    """The kernels one decoding step of ``batch`` rows over ``length`` positions issues, eagerly
    (``decode_static``: what a CUDA graph captures), in all and per layer (the step with all layers less
    the step with none, over the layers), over a pool of its own whose rows write the scratch slot."""
    dev = fwd.device
    pool = KVPool(fwd.kv_layout, batch, max_capacity=length, capacity=length, fixed=True)  # zeros: finite reads
    assert pool.data is not None
    data = pool.data
    ids = torch.zeros(batch, dtype=torch.long, device=dev)
    positions = torch.full((batch,), length - 1, dtype=torch.long, device=dev)
    write_slots = torch.full((batch,), pool.scratch_slot, dtype=torch.long, device=dev)
    seq_lens = torch.full((batch,), length, dtype=torch.long, device=dev)

    def step() -> torch.Tensor:
        return fwd.decode_static(data, ids, positions, write_slots, seq_lens, length)

    def counts() -> dict[str, int]:
        step()  # one-off allocations and kernel choices belong to no step
        out = {"aten_ops": aten_launches(step)}
        if _cuda(dev):
            out["device_kernels"] = device_kernels(step, dev)
        return out

    whole = counts()
    layers = fwd.layers
    fwd.layers = []
    try:
        outside = counts()
    finally:
        fwd.layers = layers
    n = len(layers)
    report: dict[str, Any] = {"batch": batch, "length": length, "layers": n, "dtype": str(fwd.dtype).removeprefix("torch.")}
    for key in whole:
        report[key] = {"per_step": whole[key], "outside_layers": outside[key],
                       "per_layer": round((whole[key] - outside[key]) / n, 2) if n else None}
    return report


def parse_buckets(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        b, _, length = item.strip().partition("x")
        if not b.isdigit() or not length.isdigit() or int(b) < 1 or int(length) < 2:
            raise argparse.ArgumentTypeError(f"a bucket is <batch>x<length>, such as 8x256 (got {item!r})")
        out.append((int(b), int(length)))
    return out


def load_models(args, cache_dir: Path, *, engine: bool, stock: bool) -> tuple[LoadedLM | None, LoadedLM | None]:
    """The engine's copy and an untouched one for transformers (the engine re-lays its model's
    weights), each only where a section needs it. On the CPU the engine's copy runs torch's kernels, so
    that its steps take the path CUDA replays."""
    def one(kernels: str) -> LoadedLM:
        if args.weights == "random":
            return random_loaded_lm(cache_dir, layers=args.layers, device=args.device, shape=args.shape,
                                    max_positions=4096, kernels=kernels, vocab=args.vocab)
        if args.device == "cpu":
            return load_lm(embedded_llm(), device="cpu", cache_dir=cache_dir, max_context_tokens=2048,
                           dtype="float32", kernels=kernels)
        return load_lm(embedded_llm(), device=args.device, cache_dir=cache_dir, max_context_tokens=2048)

    return (one("torch" if args.device == "cpu" else "auto") if engine else None,
            one("auto") if stock else None)


def memory_bound(lm: LoadedLM, bandwidth_gbs: float) -> dict:
    """What reading every weight once a step allows one stream (the KV is extra, and small here)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    per_step_s = weight_bytes / (bandwidth_gbs * 1e9) if bandwidth_gbs > 0 else 0.0
    return {"weight_bytes": weight_bytes, "bandwidth_gbs": bandwidth_gbs,
            "one_stream_tok_s": round(1.0 / per_step_s, 1) if per_step_s else None}


def generate_batch_rate(stock: LoadedLM, prompts: list[list[int]], tokens: int) -> float:
    """transformers' ``generate`` on ``prompts`` in one left-padded batch, greedy, ``tokens`` each: tok/s."""
    width = max(len(p) for p in prompts)
    pad = stock.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=stock.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=stock.device)
    kw = dict(attention_mask=mask, do_sample=False, repetition_penalty=1.0, pad_token_id=pad,
              max_new_tokens=tokens, min_new_tokens=tokens)
    with torch.inference_mode():
        stock.model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=pad, max_new_tokens=2)  # warm-up
        _sync(stock.device)
        t0 = time.perf_counter()
        stock.model.generate(ids, **kw)
        _sync(stock.device)
        wall = time.perf_counter() - t0
    return len(prompts) * tokens / wall


def _sync(device: torch.device) -> None:
    if _cuda(device):
        torch.cuda.synchronize(device)


def stream_prompts(lm: LoadedLM, n: int) -> list[list[int]]:
    return [render(lm, [{"role": "user", "content": LONG_QUESTIONS[i % len(LONG_QUESTIONS)]}]) for i in range(n)]


def random_prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` random ids past the bytes (no two share a prefix: none waits for another's)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(256, vocab, (length,), generator=g).tolist() for _ in range(n)]


# -- sections ----------------------------------------------------------------------------------------------
def capture_section(engine: LLMEngine, start_to_ready_s: float) -> dict:
    runner = engine.runner
    return {"decode": engine.describe().get("decode"), "batch_buckets": list(runner.buckets),
            "length_buckets": length_buckets(GRAPH_LENGTH_AT_START, engine.kv.pool.capacity) if runner.capture else [],
            **runner.capture_report.as_dict(), "engine_start_to_first_token_s": round(start_to_ready_s, 3)}


async def engine_decode_step(engine: LLMEngine, batch: int, length: int) -> dict:
    """The engine's own step with ``batch`` streams decoding at a context in ``length``'s bucket: the
    streams' prompts prefill, and once every stream has its first token, the engine's steps until the
    first one ends are that batch's decoding steps alone (``step_seconds_total``: the whole step, from
    scheduling to the tokens delivered; the wall clock: between steps too)."""
    decode = max(8, min(64, length // 2) - 8)
    prompts = random_prompts(engine.fwd.vocab_size, batch, length - min(64, length // 2), seed=batch * 7919 + length)
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=decode, ignore_eos=True)
    engine.clear_prefix_cache()
    streams = [engine.submit(p, params) for p in prompts]
    iterators = [aiter(s) for s in streams]

    async def first_delta(it) -> None:
        try:
            await anext(it)
        except StopAsyncIteration:
            pass

    await asyncio.gather(*(first_delta(it) for it in iterators))
    before, t0 = engine.stats(), time.perf_counter()
    results = [asyncio.ensure_future(s.result()) for s in streams]
    await asyncio.wait(results, return_when=asyncio.FIRST_COMPLETED)
    after, t1 = engine.stats(), time.perf_counter()
    await asyncio.gather(*results)
    for it in iterators:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        return {"steps": 0}
    return {"steps": steps,
            "step_ms": round((after["step_seconds_total"] - before["step_seconds_total"]) / steps * 1000, 4),
            "wall_per_step_ms": round((t1 - t0) / steps * 1000, 4)}


async def steps_section(engine: LLMEngine, buckets: list[tuple[int, int]]) -> list[dict]:
    dev = engine.fwd.device
    out = []
    for batch, length in buckets:
        if batch > engine.runner.buckets[-1]:
            out.append({"batch": batch, "length": length, "skipped": f"past the engine's {engine.runner.buckets[-1]} rows"})
            continue
        # On this thread (the engine's is idle: no request runs): the profiler wants the thread it began on.
        step, replays = engine.runner.padding_step(batch, length)
        row: dict[str, Any] = {"batch": batch, "length": length, "graph_replay": replays}
        row["step"] = _summary_ms(time_calls(step, dev))
        row["kernels_one_step"] = device_kernels(step, dev) if _cuda(dev) else aten_launches(step)
        row["engine"] = await engine_decode_step(engine, batch, length)
        if "step_ms" in row["engine"]:
            row["engine_step_over_replay"] = round(row["engine"]["step_ms"] / row["step"]["median_ms"], 2)
        out.append(row)
    return out


class _Timed:
    """Wraps a callable: its calls' seconds, summed."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


async def host_section(engine: LLMEngine, batches: list[int], tokens: int, repetition_penalty: float,
                       forwards: tuple[str, ...] = ("model", "stub")) -> list[dict]:
    """The host's time per decoding step at each batch: ``batch`` greedy streams of a 64-token random
    prompt decode ``tokens`` tokens. Each step of exactly ``batch`` decoding rows (no prompt in it) is
    timed whole (the engine's ``_step``: scheduling to delivery) and in parts: what a GPU runs as the
    replay of a captured graph (the forward, ``decode_static``, and the sampler's step, ``DeviceSampler.run``),
    the runner's work around them (staging the inputs, the sampler's bookkeeping), and the rest
    (scheduling, accepting tokens, detokenizing, delivery). The host's time is the step's less the graphs'
    work (on a GPU, each graph costs the host one replay call besides, which no CPU run measures).
    Medians over the steps: the host figures are tenths of a millisecond beside a forward of tens on a
    CPU, where one preemption by another process outweighs them. ``forwards``: ``model`` runs the
    model's forward; ``stub`` returns a copy of fixed random logits instead, so that the host's code runs
    as it would beside a GPU, with its caches not emptied by a forward of tens of milliseconds on the same
    cores (the tokens are then those logits', penalized). Each runs with steps overlapped (overlap.py; a
    GPU's default) and without: overlapped, a step also accepts the tokens of the step before it, after
    launching its own forward, so the device computes while the host accepts; ``exposed_host_ms`` is the
    host's time less that part, what the device waits for (on the CPU, where the forward is the host's,
    nothing overlaps: the parts are measured)."""
    from inference.llm.overlap import StepOverlap

    fwd, runner = engine.fwd, engine.runner
    sampler = runner.sampler
    assert sampler is not None, "the host section measures the static path"
    forward, eager, sampling = _Timed(fwd.decode_static), _Timed(fwd.forward), _Timed(sampler.run)
    execute, execute_sampled = _Timed(runner.execute), _Timed(runner.execute_sampled)
    model_forward = forward.fn
    fixed = torch.randn((runner.buckets[-1], fwd.vocab_size), generator=torch.Generator().manual_seed(0)).to(
        dtype=fwd.logits_dtype, device=fwd.device)

    def stub(kv, ids, *args):
        out = args[-1]
        return out.copy_(fixed[: ids.shape[0]])

    overlap_before = engine._overlap
    step_fn = engine._step
    rows: list[int] = []
    steps: list[tuple[int, float, float, float, float, float]] = []  # rows, step, forward, sampling, runner, accepted

    def accepted() -> float:
        return engine._overlap.accept_seconds if engine._overlap is not None else 0.0

    def runner_seconds() -> float:
        return execute.seconds + execute_sampled.seconds

    def step() -> None:
        before = (forward.seconds, sampling.seconds, eager.seconds, runner_seconds(), accepted())
        rows.clear()
        t0 = time.perf_counter()
        step_fn()
        wall = time.perf_counter() - t0
        if rows and eager.seconds == before[2] and forward.seconds > before[0]:  # decoding rows alone
            steps.append((rows[0], wall, forward.seconds - before[0], sampling.seconds - before[1],
                          runner_seconds() - before[3], accepted() - before[4]))

    observer = engine.step_observer
    engine.step_observer = rows.append
    fwd.decode_static, fwd.forward, sampler.run = forward, eager, sampling  # type: ignore[method-assign]
    runner.execute, runner.execute_sampled = execute, execute_sampled  # type: ignore[method-assign]
    engine._step = step  # type: ignore[method-assign]
    out = []
    try:
        for kind, overlapped, batch in [(k, o, b) for k in forwards for o in (False, True) for b in batches]:
            forward.fn = stub if kind == "stub" else model_forward
            engine._overlap = StepOverlap(fwd.device, engine.config.max_batch_size) if overlapped else None
            if batch > runner.buckets[-1]:
                out.append({"batch": batch, "skipped": f"past the engine's {runner.buckets[-1]} rows"})
                continue
            params = SamplingParams(temperature=0, repetition_penalty=repetition_penalty, max_tokens=tokens,
                                    ignore_eos=True)
            engine.clear_prefix_cache()
            steps.clear()
            streams = [engine.submit(p, params) for p in random_prompts(fwd.vocab_size, batch, 64, seed=batch)]
            await asyncio.gather(*(s.result() for s in streams))
            mine = [s for s in steps if s[0] == batch]
            row: dict[str, Any] = {"forward": kind, "overlapped": overlapped, "batch": batch, "steps": len(mine)}
            if not mine:
                out.append(row)
                continue

            def ms(values: list[float]) -> float:
                return round(statistics.median(values) * 1000.0, 4)

            host = [s[1] - s[2] - s[3] for s in mine]
            row.update({"step_ms": ms([s[1] for s in mine]), "forward_ms": ms([s[2] for s in mine]),
                        "device_sampling_ms": ms([s[3] for s in mine]), "host_ms": ms(host),
                        "host_min_ms": round(min(host) * 1000.0, 4),
                        "exposed_host_ms": ms([h - s[5] for h, s in zip(host, mine)]),
                        "runner_host_ms": ms([s[4] - s[2] - s[3] for s in mine]),
                        "accept_overlapped_ms": ms([s[5] for s in mine]),
                        "rest_ms": ms([s[1] - s[4] for s in mine]), "repetition_penalty": repetition_penalty})
            out.append(row)
    finally:
        del fwd.decode_static, fwd.forward, runner.execute, runner.execute_sampled, engine._step, sampler.run
        engine.step_observer = observer
        engine._overlap = overlap_before
    return out


async def prefill_section(engine: LLMEngine, repeats: int) -> dict:
    """The forward alone over a 762-token prompt (one chunk, over a pool of its own) against the
    engine's TTFT of the same prompt with an empty prefix cache: the engine's own cost around it
    (admission, the step, sampling, delivery to the event loop)."""
    fwd = engine.fwd
    dev = fwd.device
    prompt = random_prompts(engine.fwd.vocab_size, 1, PROMPT_TOKENS, seed=762)[0]
    ids = torch.tensor(prompt, dtype=torch.long, device=dev)
    positions = torch.arange(len(prompt), device=dev)
    pool = KVPool(fwd.kv_layout, 1, max_capacity=len(prompt), capacity=len(prompt))
    pool.acquire()

    def forward() -> torch.Tensor:
        return fwd.forward(pool, ids, positions, [Segment(0, 0, len(prompt))], [len(prompt) - 1])

    alone = time_calls(forward, dev, max(3, repeats * 3))
    ttfts = []
    for _ in range(max(3, repeats)):
        engine.clear_prefix_cache()
        t, _res = await ttft(engine, prompt, max_tokens=1)
        ttfts.append(t * 1000.0)
    forward_ms, ttft_ms = statistics.median(alone), statistics.median(ttfts)
    return {"prompt_tokens": len(prompt), "chunk_tokens": engine.config.prefill_chunk_tokens,
            "forward": _summary_ms(alone), "ttft": _summary_ms(ttfts),
            "engine_overhead_ms": round(ttft_ms - forward_ms, 3)}


async def bench_streams(engine: LLMEngine, lm: LoadedLM, tokens: int, repeats: int, bound: dict) -> dict:
    out = {}
    for n in (1, 8, 32):
        runs = []
        for _ in range(repeats):
            engine.clear_prefix_cache()
            runs.append(await run_streams(engine, lm, n, tokens))
        best = sorted(runs, key=lambda d: d["aggregate_tok_s"])[len(runs) // 2]
        if bound["one_stream_tok_s"]:
            best["share_of_memory_bound"] = round(best["aggregate_tok_s"] / (n * bound["one_stream_tok_s"]), 3)
        out[f"streams_{n}"] = best
    return out


async def bench_batched_equals_solo(engine: LLMEngine, lm: LoadedLM, tokens: int) -> dict:
    """8 greedy streams together, then each alone: how many leading tokens agree."""
    prompts = stream_prompts(lm, 8)
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    engine.clear_prefix_cache()
    batched = [await s.result() for s in [engine.submit(p, params) for p in prompts]]
    agree = []
    for prompt, together in zip(prompts, batched):
        engine.clear_prefix_cache()
        alone = await engine.submit(prompt, params).result()
        agree.append(leading_agreement(alone.token_ids, together.token_ids))
    return {"leading_tokens_equal": agree,
            "streams_identical": f"{sum(a.split('/')[0] == a.split('/')[1] for a in agree)}/{len(agree)}"}


async def versus_transformers(stock: LoadedLM, tokens: int, streams: dict | None) -> dict:
    prompts = stream_prompts(stock, 8)
    one = await run_in_own_thread(generate_batch_rate, stock, prompts[:1], tokens)
    eight = await run_in_own_thread(generate_batch_rate, stock, prompts, tokens)
    cbm = await run_in_own_thread(transformers_batch, stock, prompts, tokens)
    out: dict[str, Any] = {
        "generate_1_stream_tok_s": round(one, 2),
        "generate_8_streams_tok_s": round(eight, 2),
        "continuous_batching_8_streams_tok_s": cbm["aggregate_tok_s"],
        "continuous_batching_errors": cbm["errors"],
        "target": ">= 3 each",
    }
    if streams:
        out["ratio_1_stream_vs_generate"] = round(streams["streams_1"]["aggregate_tok_s"] / one, 2)
        out["ratio_8_streams_vs_generate"] = round(streams["streams_8"]["aggregate_tok_s"] / eight, 2)
        out["ratio_8_streams_vs_continuous_batching"] = round(
            streams["streams_8"]["aggregate_tok_s"] / max(cbm["aggregate_tok_s"], 1e-9), 2)
    return out


async def _section(em: Emitter, name: str, make) -> Any:
    try:
        result = await make()
    except Exception as exc:  # recorded; the next sections still run
        logging.getLogger(__name__).exception("section %s failed", name)
        em.emit(name, error=exc)
        return None
    em.emit(name, result)
    return result


async def main_async(args, em: Emitter) -> None:
    sections = args.sections
    engine_sections = [s for s in ENGINE_SECTIONS if s in sections]
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="gw-bench-gpu-") as tmp:
        cache_dir = Path(args.cache_dir).expanduser() if args.weights == "embedded" else Path(tmp)
        lm, stock = await run_in_own_thread(lambda: load_models(args, cache_dir, engine=bool(engine_sections),
                                                                stock="3_versus_transformers" in sections))
        base = lm or stock
        assert base is not None
        setup: dict[str, Any] = {"device": args.device, "weights": args.weights, "layers": len(base.model.model.layers),
                                 "dtype": str(base.dtype).removeprefix("torch."), "vocab": base.vocab_size,
                                 "sections": list(sections),
                                 "medians_of": args.repeats, "targets": TARGETS.get(args.shape, {})}
        if cuda:
            setup["gpu"] = torch.cuda.get_device_name()
        setup["memory_bound"] = bound = memory_bound(base, args.bandwidth_gbs if cuda else 0.0)
        if lm is not None:
            config = EngineConfig(max_batch_size=32, max_queued_requests=64, prefill_chunk_tokens=args.prefill_chunk,
                                  static_decode=True if args.device == "cpu" else None,
                                  overlap_steps=True if args.device == "cpu" else None)
            t0 = time.perf_counter()
            async with running(LLMEngine(lm, config)) as engine:
                setup["paths"] = engine.describe()
                em.emit("setup", setup)
                await warm_up(engine, lm)  # after the graphs' capture, which the engine does first
                ready_s = time.perf_counter() - t0
                if "capture" in sections:
                    await _section(em, "capture", lambda: _now(capture_section(engine, ready_s)))
                if "kernels" in sections:
                    await _section(em, "kernels", lambda: _kernels(engine.fwd, args.buckets))
                if "steps" in sections:
                    await _section(em, "steps", lambda: steps_section(engine, args.buckets))
                if "host" in sections:
                    await _section(em, "host", lambda: host_section(engine, args.host_batches, args.tokens,
                                                                    args.host_repetition_penalty))
                if "prefill" in sections:
                    await _section(em, "prefill", lambda: prefill_section(engine, args.repeats))
                if "1_ttft" in sections:
                    await warm_up(engine, lm)
                    await _section(em, "1_ttft", lambda: bench_system_prompt(engine, lm, args.repeats,
                                                                            target_tokens=PROMPT_TOKENS - 20))
                if "2_streams" in sections:
                    await warm_up(engine, lm)
                    await _section(em, "2_streams", lambda: bench_streams(engine, lm, args.tokens, args.repeats, bound))
                if "4_batched_equals_solo" in sections:
                    await _section(em, "4_batched_equals_solo", lambda: bench_batched_equals_solo(engine, lm, args.tokens))
                em.emit("engine_stats", {k: v for k, v in engine.stats().items()
                                         if k in ("cuda_graphs", "cuda_graph_failures", "graph_replays", "padded_rows",
                                                  "steps", "avg_step_ms")})
            del engine, lm
        else:
            em.emit("setup", setup)
        if stock is not None:
            if cuda:
                torch.cuda.empty_cache()
            await _section(em, "3_versus_transformers",
                           lambda: versus_transformers(stock, args.tokens, em.earlier("2_streams")))


async def _now(value: Any) -> Any:
    return value


async def _kernels(fwd: LeanForward, buckets: list[tuple[int, int]]) -> list[dict]:
    return [decode_step_kernels(fwd, batch, length) for batch, length in dict.fromkeys(buckets)]


# The targets on one H100 in bfloat16 (1_ttft in seconds, 2_streams in tok/s).
TARGETS = {
    "qwen2.5-1.5b": {"streams_1": 450, "streams_8": 3000, "streams_32": 8000, "ttft_first_s": 0.020,
                     "ttft_same_system_other_question_s": 0.010},
    "smollm2-135m": {"streams_1": 1000, "streams_8": 5000, "ttft_first_s": 0.012},
}


def parse_sections(text: str) -> tuple[str, ...]:
    wanted = set()
    for item in text.split(","):
        name = SHORT_NAMES.get(item.strip(), item.strip())
        if name not in SECTIONS:
            raise argparse.ArgumentTypeError(
                f"unknown section {item!r} (sections: {', '.join(sorted({*SECTIONS, *SHORT_NAMES}))})")
        wanted.add(name)
    return tuple(s for s in SECTIONS if s in wanted)


def _vocab(text: str) -> int:
    n = int(text)
    if n < 259:
        raise argparse.ArgumentTypeError(f"a vocabulary of {n} tokens has no room for the 256 bytes and 3 specials")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--weights", choices=("random", "embedded"), default="random")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="smollm2-135m", help="for --weights random")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of random weights (default: the shape's)")
    ap.add_argument("--vocab", type=_vocab, default=None,
                    help="for --weights random: this many tokens instead of the shape's (at least 259: the bytes and "
                         "ChatML's specials); on a CPU, --vocab 512 leaves the host section the host's own work, "
                         "without the vocabulary-wide arithmetic (the penalties' and argmax's) a GPU does on the device")
    ap.add_argument("--sections", type=parse_sections, default=parse_sections(DEFAULT_SECTIONS),
                    help=f"comma-separated, run in the documented order (default {DEFAULT_SECTIONS}; also "
                         "kernels, steps, host, prefill)")
    ap.add_argument("--count-kernels", action="store_true", help="run the kernels section alone")
    ap.add_argument("--buckets", type=parse_buckets, default=parse_buckets(DEFAULT_BUCKETS),
                    help=f"<batch>x<length>,... for the steps and kernels sections (default {DEFAULT_BUCKETS})")
    ap.add_argument("--host-batches", type=lambda t: [int(b) for b in t.split(",")], default=[1, 8, 32],
                    help="streams for the host section (default 1,8,32)")
    ap.add_argument("--host-repetition-penalty", type=float, default=1.1, help="for the host section")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-chunk", type=int, default=2048, help="prompt tokens per engine step")
    ap.add_argument("--bandwidth-gbs", type=float, default=H100_SXM_GBS, help="GPU memory bandwidth for the bound")
    ap.add_argument("--cache-dir", default="~/.cache/realtime-gateway", help="for --weights embedded")
    ap.add_argument("--out", type=Path, default=None, help="also append each section's line to <out>/gpu-<shape>.jsonl")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.count_kernels:
        args.sections = ("kernels",)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("torch sees no CUDA device (use --device cpu to run the same sections on the CPU)")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    em = Emitter(args.shape, args.out)
    asyncio.run(main_async(args, em))
    return 1 if any(s != "3_versus_transformers" for s in em.failed) else 0


if __name__ == "__main__":
    sys.exit(main())
