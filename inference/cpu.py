"""Cores that model work other than the LLM (Whisper, Piper) is using right now.

The LLM engine's adaptive thread policy reads this: while Piper synthesizes a clause or Whisper
transcribes, a decoding step uses the cores left over instead of contending for all of them (on two
cores, a 2-thread step stalls on a core Piper holds, and Piper waits for the step).

Some work is worth every core: a reply's first clause, which the user is waiting to hear while
nothing plays yet. It is declared `exclusive`, and the engine does not step while it runs (up to a
bound), so Piper can use all the cores. And an engine whose every reply is ahead of its listener (paced)
does not step while Whisper or Piper runs at all (`wait_for_idle_cores`), until one of them is due.

It also keeps the core-seconds each kind of work has held (`charge`, `core_seconds`): the wall time of
each model call times the cores it runs on. That is what a voice turn costs the machine, stage by
stage (/metrics, `gateway bench --sessions 1,2,4,8`); on a busy machine a call's wall time includes
waiting for a core, so the sum can exceed the process's own CPU time, which /metrics reports beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_changed = threading.Condition()
_busy = 0
_exclusive = 0
_charged: dict[str, float] = {}
_charged_lock = threading.Lock()


def charge(work: str, core_seconds: float) -> None:
    """Add `core_seconds` to what `work` (asr_final, tts, llm, ...) has held so far (thread-safe)."""
    with _charged_lock:
        _charged[work] = _charged.get(work, 0.0) + core_seconds


def core_seconds() -> dict[str, float]:
    """The core-seconds each kind of work has held since the process started."""
    with _charged_lock:
        return dict(_charged)


@contextmanager
def using_cores(cores: int = 1, *, exclusive: bool = False, work: str | None = None) -> Iterator[None]:
    """Declare `cores` cores busy for the duration of the block (thread-safe, nestable); with `work`,
    charge it the block's wall time times `cores`.

    `exclusive`: nothing else should run meanwhile; `wait_for_exclusive_work` blocks until it ends."""
    global _busy, _exclusive
    with _changed:
        _busy += cores
        _exclusive += exclusive
    started = time.perf_counter()
    try:
        yield
    finally:
        if work is not None:
            charge(work, cores * (time.perf_counter() - started))
        with _changed:
            _busy -= cores
            _exclusive -= exclusive
            _changed.notify_all()


def cores_in_use() -> int:
    return _busy


def wait_for_idle_cores(timeout: float) -> float:
    """Block while other model work holds any core, at most `timeout` seconds; returns the seconds waited."""
    if not _busy:
        return 0.0
    started = time.monotonic()
    with _changed:
        _changed.wait_for(lambda: not _busy, timeout)
    return time.monotonic() - started


def wait_for_exclusive_work(timeout: float) -> float:
    """Block while exclusive work runs, at most `timeout` seconds; returns the seconds waited."""
    if not _exclusive:  # the common case: no lock, no clock
        return 0.0
    started = time.monotonic()
    with _changed:
        _changed.wait_for(lambda: not _exclusive, timeout)
    return time.monotonic() - started
