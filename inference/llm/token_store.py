"""The prefix cache's KV, token by token, handed out by index (SGLang's token pool): the radix tree
(``radix_cache.py``) keeps :class:`TokenRun` index runs into a :class:`TokenKVStore`, and the KV manager
(``kv_manager.py``) copies a matched prefix out of it into a request's slot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class TokenKVStore:
    """KV token by token, handed out by index: ``data`` is ``token_shape`` with a tokens axis inserted
    at ``token_dim``. Allocated at first use; the lowest free indices go first, so a store that is
    never full touches only its start (on a CPU the rest is never committed)."""

    def __init__(self, token_shape: Sequence[int], token_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.token_shape = tuple(int(s) for s in token_shape)
        self.token_dim = int(token_dim)
        self.capacity = max(0, int(capacity))
        self.dtype = dtype
        self.device = torch.device(device)
        self.data: torch.Tensor | None = None
        self._free = list(range(self.capacity - 1, -1, -1))  # a stack: pops give 0, 1, 2, ...

    @property
    def bytes_per_token(self) -> int:
        n = 1
        for s in self.token_shape:
            n *= s
        return n * torch.finfo(self.dtype).bits // 8

    @property
    def free_tokens(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> TokenRun | None:
        """``n`` indices, or None when fewer are free."""
        if n > len(self._free):
            return None
        if self.data is None:
            shape = list(self.token_shape)
            shape.insert(self.token_dim, self.capacity)
            self.data = torch.empty(shape, dtype=self.dtype, device=self.device)
        taken = [self._free.pop() for _ in range(n)]
        start = taken[0] if taken == list(range(taken[0], taken[0] + n)) else -1
        return TokenRun(torch.tensor(taken, dtype=torch.long, device=self.device), start)

    def free(self, run: TokenRun) -> None:
        self._free.extend(reversed(run.indices.tolist()))

    def write(self, run: TokenRun, kv: torch.Tensor) -> None:
        assert self.data is not None
        if run.start >= 0:  # consecutive (the usual case): a plain copy, faster than index_copy_
            self.data.narrow(self.token_dim, run.start, len(run)).copy_(kv)
        else:
            self.data.index_copy_(self.token_dim, run.indices, kv.to(self.dtype))

    def read(self, run: TokenRun) -> torch.Tensor:
        """A run's KV: a view where it is consecutive (copy it before the store changes), else a gather."""
        assert self.data is not None
        if run.start >= 0:
            return self.data.narrow(self.token_dim, run.start, len(run))
        return self.data.index_select(self.token_dim, run.indices)


@dataclass(frozen=True)
class TokenRun:
    """Indices into a :class:`TokenKVStore`; ``start`` >= 0 when they are ``start, start + 1, ...``."""

    indices: torch.Tensor
    start: int = -1

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def head(self, n: int) -> TokenRun:
        return TokenRun(self.indices[:n], self.start)

    def tail(self, n: int) -> TokenRun:
        return TokenRun(self.indices[n:], self.start + n if self.start >= 0 else -1)
