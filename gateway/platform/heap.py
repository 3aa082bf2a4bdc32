"""Freed memory goes back to the system once the gateway is quiet (see inference.memory)."""

from __future__ import annotations

import asyncio
import contextlib

from inference.memory import return_freed_memory


class HeapTrimmer:
    """Counts open Realtime sessions; when the last one closes, and none opens again for ``delay_s``,
    trims the heap on a worker thread. Only then: a trim holds glibc's arena locks while it walks the
    heaps, and while sessions run the memory is about to be used again anyway."""

    def __init__(self, delay_s: float = 2.0) -> None:
        self.delay_s = delay_s
        self.open_sessions = 0
        self.trims = 0
        self._pending: asyncio.Task[None] | None = None

    def opened(self) -> None:
        self.open_sessions += 1
        if self._pending is not None:
            self._pending.cancel()  # busy again: no trim now
            self._pending = None

    def closed(self) -> None:
        self.open_sessions -= 1
        if self.open_sessions == 0 and self._pending is None:
            self._pending = asyncio.get_running_loop().create_task(self._trim_later(), name="heap trim")

    async def _trim_later(self) -> None:
        try:
            await asyncio.sleep(self.delay_s)
            await asyncio.to_thread(return_freed_memory)
            self.trims += 1
        finally:
            if self._pending is asyncio.current_task():
                self._pending = None

    async def close(self) -> None:
        task, self._pending = self._pending, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
