"""The engine's KV memory, behind one manager (the seam of vLLM v1's ``kv_cache_manager.py``).

Two stores of KV, one layout each:

- :class:`KVPool`: the KV of every running request, one *slot* per request, in one tensor
  ``[layers, 2, slots + 1, kv_heads, capacity, head_dim]``. A step's kernels read a request's KV as one
  contiguous run (the CPU kernels of ``decode_attention.c`` and ``layer_stack.c``, and sdpa), and the
  decoding rows of a step attend in one call over slots ``0..n-1``. So slots stay compact: freeing a
  slot moves the last slot's KV into it. The extra last slot is scratch: padding rows of a
  fixed-size decode step (``model_runner.py``) write their keys and values there.
- :class:`~.token_store.TokenKVStore`: the prefix cache's KV, token by token in one tensor
  ``[layers, 2, kv_heads, tokens, head_dim]``, handed out by index. The radix tree (``radix_cache.py``)
  keeps index runs into it, as SGLang's radix cache keeps indices into its token pool: a split is a
  slice of an index run, eviction returns indices, and no KV tensor is cloned per node.

:class:`KVManager` hands out :class:`SlotHandle` objects and hides both layouts: the scheduler reads
a handle's slot and length to plan a step, and nothing else writes a slot number anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .radix_cache import PrefixCache, PrefixMatch, RadixNode
from .token_store import TokenKVStore


@dataclass(frozen=True)
class KVLayout:
    """What the KV of one token looks like: ``layers x 2 x kv_heads x head_dim`` values of ``dtype``."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    max_positions: int

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


class KVPool:
    """The running requests' KV, one slot each (see the module docstring).

    Capacity (tokens per slot) grows geometrically, for all slots at once; on a CPU the memory of
    untouched positions is never committed, and an idle pool gives its memory back. ``fixed=True``
    (CUDA graphs) allocates ``capacity`` once, zero-filled, and never moves it: a captured graph
    holds the tensor's address, and zeros keep every position finite for the masked reads.
    """

    def __init__(self, layout: KVLayout, slots: int, *, max_capacity: int, capacity: int = 256,
                 fixed: bool = False) -> None:
        self.layout = layout
        self.slots = int(slots)
        self.max_capacity = min(int(max_capacity), layout.max_positions)
        self.fixed = fixed
        self.data: torch.Tensor | None = None
        self._capacity = self.max_capacity if fixed else max(16, min(int(capacity), self.max_capacity))
        self.lengths = [0] * self.slots
        # Positions [0, clean) of a slot hold finite numbers (real KV, an old owner's KV, or zeros);
        # attention over padded slots reads (masked) positions up to the longest slot.
        self.clean = [0] * (self.slots + 1)
        self.used = 0
        # Bumped whenever ``data`` is a new tensor: what was captured over the old one is stale.
        self.generation = 0
        if fixed:
            self._allocate(self._capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def scratch_slot(self) -> int:
        """The slot no request owns, where padding rows write."""
        return self.slots

    def _allocate(self, capacity: int) -> torch.Tensor:
        lay = self.layout
        shape = (lay.layers, 2, self.slots + 1, lay.kv_heads, capacity, lay.head_dim)
        fill = torch.zeros if self.fixed else torch.empty
        new = fill(shape, dtype=lay.dtype, device=lay.device)
        self.data = new
        self.generation += 1
        if self.fixed:
            self.clean = [capacity] * (self.slots + 1)
        return new

    def ensure_capacity(self, needed: int) -> None:
        if needed > self.max_capacity:
            raise ValueError(f"sequence of {needed} tokens exceeds the context window ({self.max_capacity})")
        if self.data is not None and needed <= self._capacity:
            return
        old = self.data
        cap = self._capacity
        while cap < needed:
            cap *= 2
        cap = min(cap, self.max_capacity)
        new = self._allocate(cap)
        longest = 0
        if old is not None and self.used:
            longest = max(self.lengths[: self.used])
            if longest:
                new[:, :, : self.used, :, :longest].copy_(old[:, :, : self.used, :, :longest])
        self.clean = [min(c, longest) if i < self.used else 0 for i, c in enumerate(self.clean)]
        self._capacity = cap

    def sanitize(self, slot: int, upto: int) -> None:
        """Make positions [0, upto) of ``slot`` finite (zeros beyond what was ever written)."""
        c = self.clean[slot]
        if c >= upto or self.data is None:
            return
        hi = min(self._capacity, max(upto, c + 64))
        self.data[:, :, slot, :, c:hi].zero_()
        self.clean[slot] = hi

    def acquire(self) -> int:
        """The next free slot (``used``, as slots are compact)."""
        if self.used >= self.slots:
            raise RuntimeError("no free KV slot")
        if self.data is None:
            self._allocate(self._capacity)
            self.clean = [0] * (self.slots + 1)
        slot = self.used
        self.used += 1
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> int | None:
        """Free ``slot``. The last slot's KV moves into it so that the used slots stay ``0..used-1``;
        returns the slot that moved (now ``slot``), or None."""
        last = self.used - 1
        if slot < 0 or slot > last:
            raise ValueError(f"slot {slot} is not in use")
        moved = None
        if slot != last:
            n = self.lengths[last]
            if n:
                assert self.data is not None
                self.data[:, :, slot, :, :n].copy_(self.data[:, :, last, :, :n])
            self.lengths[slot] = n
            self.clean[slot] = max(self.clean[slot], n)
            moved = last
        self.lengths[last] = 0
        self.used = last
        if self.used == 0 and not self.fixed:
            self.data = None  # idle: give the memory back
        return moved

    def view(self, slot: int, start: int, stop: int) -> torch.Tensor:
        """KV of tokens [start, stop) of ``slot``: ``[layers, 2, kv_heads, n, head_dim]`` (a view)."""
        assert self.data is not None
        return self.data[:, :, slot, :, start:stop]

    def write(self, slot: int, start: int, kv: torch.Tensor) -> None:
        """Copy ``kv`` (``[layers, 2, kv_heads, n, head_dim]``) to positions [start, start+n) of ``slot``."""
        n = kv.shape[3]
        self.ensure_capacity(start + n)
        if start > self.lengths[slot]:
            raise ValueError(f"write at {start} leaves a gap after {self.lengths[slot]} tokens")
        assert self.data is not None
        self.data[:, :, slot, :, start : start + n].copy_(kv)
        self.lengths[slot] = max(self.lengths[slot], start + n)
        self.clean[slot] = max(self.clean[slot], start + n)

    def commit(self, slot: int, end: int) -> None:
        """A step wrote positions up to ``end`` of ``slot``."""
        if end > self.lengths[slot]:
            self.lengths[slot] = end
        if end > self.clean[slot]:
            self.clean[slot] = end


class SlotHandle:
    """A running request's claim on a KV slot. Only the manager changes where it points."""

    __slots__ = ("_slot", "__weakref__")

    def __init__(self, slot: int) -> None:
        self._slot = slot

    @property
    def slot(self) -> int:
        return self._slot


class KVManager:
    """Slots for running requests, the prefix cache over the token store, and the moves between them."""

    def __init__(self, layout: KVLayout, slots: int, *, max_capacity: int, prefix_cache_bytes: int,
                 fixed_pool: bool = False, capacity: int = 0) -> None:
        self.layout = layout
        if capacity <= 0:
            # 64 MiB per slot, clamped to 256..1024 tokens (it grows by doubling).
            capacity = max(256, min(1024, (64 << 20) // layout.bytes_per_token))
        self.pool = KVPool(layout, slots, max_capacity=max_capacity, capacity=capacity, fixed=fixed_pool)
        store = TokenKVStore((layout.layers, 2, layout.kv_heads, layout.head_dim), 3,
                             max(0, prefix_cache_bytes) // layout.bytes_per_token, layout.dtype, layout.device)
        self.cache = PrefixCache(store)
        self._handles: list[SlotHandle | None] = [None] * slots
        # Each conversation's last KV, pinned in the cache until its next request caches more or it ends.
        self._pins: dict[str, RadixNode] = {}

    # -- slots ---------------------------------------------------------------------------------------
    def allocate(self) -> SlotHandle:
        slot = self.pool.acquire()
        handle = SlotHandle(slot)
        self._handles[slot] = handle
        return handle

    def free(self, handle: SlotHandle) -> None:
        slot = handle.slot
        if self._handles[slot] is not handle:
            raise ValueError("handle is not live")
        moved = self.pool.release(slot)
        self._handles[slot] = None
        if moved is not None:
            mover = self._handles[moved]
            assert mover is not None
            mover._slot = slot
            self._handles[slot] = mover
            self._handles[moved] = None
        handle._slot = -1

    def length(self, handle: SlotHandle) -> int:
        return self.pool.lengths[handle.slot]

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` positions in every slot (before a step writes them)."""
        self.pool.ensure_capacity(tokens)

    # -- prefix cache ----------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], *, max_length: int, record: bool = True) -> PrefixMatch:
        return self.cache.match(tokens, max_length=max_length, record=record)

    def load_prefix(self, handle: SlotHandle, match: PrefixMatch) -> None:
        """Copy a match's cached KV to the start of ``handle``'s slot, a node's run at a time."""
        pos = 0
        for piece in self.cache.read(match):
            self.pool.write(handle.slot, pos, piece)
            pos += piece.shape[3]

    def cache_prefix(self, handle: SlotHandle, tokens: Sequence[int], upto: int, *,
                     conversation_id: str | None = None) -> None:
        """Put the KV of ``tokens[:upto]`` (what ``handle``'s slot holds) in the prefix cache; with a
        conversation, pinned for it in place of what was pinned for it before."""
        upto = min(upto, self.pool.lengths[handle.slot])
        if upto <= 0:
            return
        pool, slot = self.pool, handle.slot
        node = self.cache.insert(tokens[:upto], lambda a, b: pool.view(slot, a, b), pin=conversation_id is not None)
        if conversation_id is not None:
            old = self._pins.pop(conversation_id, None)
            if node is not None:
                self._pins[conversation_id] = node
            self.cache.unpin(old)

    @property
    def caches_prefixes(self) -> bool:
        return self.cache.max_bytes > 0

    # -- conversations ---------------------------------------------------------------------------------
    def end_conversation(self, conversation_id: str) -> None:
        """Unpin the conversation's KV and drop the part of it no other sequence shares."""
        self.cache.release(self._pins.pop(conversation_id, None))

    def clear(self) -> None:
        """Drop every cached prefix, pins included."""
        for node in self._pins.values():
            self.cache.unpin(node)
        self._pins.clear()
        self.cache.clear()

    def stats(self) -> dict[str, float]:
        return {**self.cache.snapshot(), "conversations_pinned": len(self._pins),
                "kv_pool_capacity_tokens": self.pool.capacity, "kv_pool_slots_used": self.pool.used}
