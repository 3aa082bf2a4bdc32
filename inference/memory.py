"""Giving freed heap memory back to the operating system."""

from __future__ import annotations

import ctypes


def return_freed_memory() -> None:
    """Hand glibc's free heap pages back to the system (malloc_trim). Tensors and buffers of a few
    hundred KB to tens of MB are not always mmapped of their own (glibc's threshold for that grows as
    large blocks are freed), so freeing them leaves the process's memory at its high-water mark: after
    200 Realtime sessions had come and gone, the gateway held 2.2 GB, and 1.5 GB after a trim (its
    start: 1.47 GB). Blocking (it walks the heaps): call it off the event loop. Elsewhere (no glibc) a
    no-op."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
