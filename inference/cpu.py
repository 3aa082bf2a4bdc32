"""Cores that model work other than the LLM (Whisper, Piper) is using right now.

The LLM engine's adaptive thread policy reads this: while Piper synthesizes a clause or Whisper
transcribes, a decoding step uses the cores left over instead of contending for all of them (on two
cores, a 2-thread step stalls on a core Piper holds, and Piper waits for the step).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_busy = 0


@contextmanager
def using_cores(cores: int = 1) -> Iterator[None]:
    """Declare `cores` cores busy for the duration of the block (thread-safe, nestable)."""
    global _busy
    with _lock:
        _busy += cores
    try:
        yield
    finally:
        with _lock:
            _busy -= cores


def cores_in_use() -> int:
    return _busy
