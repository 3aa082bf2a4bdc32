"""The heap is trimmed once the last session has closed and none opened again within the delay."""

from __future__ import annotations

import asyncio

from gateway.platform import heap
from gateway.platform.heap import HeapTrimmer


async def test_trims_only_when_quiet(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "return_freed_memory", lambda: calls.append(1))
    trimmer = HeapTrimmer(delay_s=0.05)
    trimmer.opened()
    trimmer.opened()
    trimmer.closed()
    await asyncio.sleep(0.1)
    assert calls == []  # a session is still open
    trimmer.closed()
    trimmer.opened()  # busy again within the delay: no trim
    await asyncio.sleep(0.1)
    assert calls == []
    trimmer.closed()
    await asyncio.sleep(0.1)
    assert calls == [1] and trimmer.trims == 1
    trimmer.opened()
    trimmer.closed()
    await trimmer.close()  # a pending trim is cancelled and awaited
    await asyncio.sleep(0.1)
    assert calls == [1]
