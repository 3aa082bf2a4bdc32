"""Sampling on the static path's device (a GPU's), in a step of fixed shapes that a CUDA graph captures.

The rows sampled here are greedy rows and rows with a temperature alone (``RowSampler.device_sampled``);
top-k, top-p, grammars and OpenAI's penalties stay on the host (sampling.py). Each request that comes
here gets a row of the sampler's state, kept on the device for as long as it runs:

- ``ids``: the ids it has seen (its prompt's, where it has a repetition penalty), then every token it
  samples, appended by the step that samples it. The rest of the row repeats its first entry (0 where
  it has none: a factor of 1 writes the value back), so a step may gather any width of it: a repeated id
  is penalized to the same value twice.
- its suppressed ids (the EOS ids of ``ignore_eos``), its repetition penalty, its temperature, its seed
  and the number of tokens it drew.

A step (:meth:`DeviceSampler.run`) penalizes the logits at its rows' ids (the same float32 arithmetic
as :meth:`RowSampler.process`), draws the temperature rows by Gumbel-max, ``argmax(logits / t + g)``,
with noise hashed from the seed, the draw's index and the token id (:func:`gumbel_noise`: a request's
tokens do not depend on its batch, and no generator runs per row), takes the argmax and appends it. Its
only input besides the logits is ``index``, each logits row's state row; a padding row points at a
scratch row whose state never advances. Its shapes depend on the batch alone, so the model runner
captures it per batch bucket, after the forward's graph (model_runner.py), and a step's sampling costs
the host one replay. The host's part (:meth:`prepare`, :meth:`advance_host`) is bookkeeping: a row is written
from the host once, when its request first comes (again only if it observed a token another path
sampled), and the flags of a step's rows are worked out again only when its rows change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .sampling import MAX_DEVICE_SUPPRESSED as MAX_SUPPRESSED
from .sampling import RowSampler


class SampleFlags(NamedTuple):
    """Which parts of a sampling step its rows need (each a separately captured graph)."""

    suppress: bool  # a row has suppressed ids
    penalty: bool  # a row has a repetition penalty
    noisy: bool  # a row draws with a temperature


ALL_FLAGS = tuple(SampleFlags(s, p, n) for s in (False, True) for p in (False, True) for n in (False, True))


class DeviceSampler:
    """The state of up to ``slots`` requests' sampling on ``device`` (one row each, plus a scratch row for
    padding), for contexts of up to ``width - 1`` tokens. Its tensors never move: a captured graph holds
    their addresses. :meth:`release` hands a finished request's row back."""

    def __init__(self, slots: int, width: int, vocab: int, device: torch.device | str) -> None:
        if slots < 1 or width < 2:
            raise ValueError("a device sampler needs a slot and a width of at least 2")
        self.device = dev = torch.device(device)
        self.width = width
        self.scratch = slots  # the padding rows' row
        rows = slots + 1
        self.ids = torch.zeros((rows, width), dtype=torch.long, device=dev)
        self.filled = torch.zeros(rows, dtype=torch.long, device=dev)  # entries of each row
        self.fill = [0] * rows  # the same, as the host knows it
        self.suppressed = torch.zeros((rows, MAX_SUPPRESSED), dtype=torch.long, device=dev)
        self.suppressing = torch.zeros((rows, MAX_SUPPRESSED), dtype=torch.bool, device=dev)  # entry is an id
        self.factor = torch.ones((rows, 1), dtype=torch.float32, device=dev)  # repetition penalty
        self.temperature = torch.ones((rows, 1), dtype=torch.float32, device=dev)  # 1 for a greedy row
        self.noisy = torch.zeros((rows, 1), dtype=torch.float32, device=dev)  # 1: the row draws
        self.seeds = torch.zeros(rows, dtype=torch.long, device=dev)
        self.drawn = torch.zeros(rows, dtype=torch.long, device=dev)  # tokens it drew so far
        self.advance = torch.ones(rows, dtype=torch.long, device=dev)  # 0 for the scratch row: it stays put
        self.advance[self.scratch] = 0
        self.tokens = torch.arange(vocab, device=dev)
        self._free = list(range(slots - 1, -1, -1))
        self._key: tuple[int, ...] | None = None
        self._flags = SampleFlags(False, False, False)
        self._index = torch.empty(0, dtype=torch.long)
        self.host_writes = 0  # rows written from the host (a sampler's first step, or a resync)

    def release(self, sampler: RowSampler) -> None:
        if sampler.mask_row is not None:
            self._free.append(sampler.mask_row)
            sampler.mask_row = None
            self._key = None

    # -- the host's part -------------------------------------------------------------------------------
    def prepare(self, samplers: Sequence[RowSampler]) -> SampleFlags:
        """Give each of a step's samplers its row (written from the host where it has none, or lacks a
        token it observed: one sampled on another path); the flags of the step's rows."""
        for s in samplers:
            if s.mask_row is None or s.mask_marked < s.observed:
                self._attach(s)
            if self.fill[s.mask_row] >= self.width:  # type: ignore[index]
                raise RuntimeError(f"a request's ids outgrew the device sampler's width ({self.width})")
        key = tuple(s.mask_row for s in samplers if s.mask_row is not None)  # every one has its row now
        if key != self._key:
            self._key = key
            self._index = torch.tensor(key, dtype=torch.long).to(self.device, non_blocking=True)
            self._flags = SampleFlags(any(s.suppress_ids for s in samplers),
                                      any(s.repetition_penalty != 1.0 for s in samplers),
                                      any(not s.greedy for s in samplers))
        return self._flags

    def advance_host(self, samplers: Sequence[RowSampler]) -> None:
        """After a step of these samplers: each row holds one token more (the engine observes it later)."""
        for s in samplers:
            self.fill[s.mask_row] += 1  # type: ignore[index]
            s.mask_marked += 1

    def invalidate(self, samplers: Sequence[RowSampler]) -> None:
        """A step of these samplers failed part-way: each row is written again from the host at its next step."""
        for s in samplers:
            s.mask_marked = -1

    def _attach(self, s: RowSampler) -> None:
        if not s.device_sampled:
            raise ValueError("this request is not sampled on the device")
        if s.mask_row is None:
            if not self._free:
                raise RuntimeError("more requests sampled on the device than the sampler has rows")
            s.mask_row = self._free.pop()
            self._key = None
        row = s.mask_row
        seen = s.seen_ids(torch.device("cpu")) if s.repetition_penalty != 1.0 else torch.empty(0, dtype=torch.long)
        n = int(seen.shape[0])
        if n >= self.width:
            raise RuntimeError(f"a request's ids outgrew the device sampler's width ({self.width})")
        line = torch.full((self.width,), int(seen[0]) if n else 0, dtype=torch.long)
        line[:n] = seen
        self.ids[row].copy_(line.to(self.device))
        self.filled[row] = n
        self.fill[row] = n
        k = len(s.suppress_ids)
        # A row with suppressed ids repeats its first one (and suppresses it again: one value per id).
        sup = torch.full((MAX_SUPPRESSED,), s.suppress_ids[0] if k else 0, dtype=torch.long)
        sup[:k] = torch.tensor(s.suppress_ids, dtype=torch.long)
        self.suppressed[row].copy_(sup.to(self.device))
        self.suppressing[row].fill_(bool(k))
        self.factor[row] = s.repetition_penalty
        self.temperature[row] = 1.0 if s.greedy else s.temperature
        self.noisy[row] = 0.0 if s.greedy else 1.0
        self.seeds[row] = s.seed_value & (2**62 - 1)
        self.drawn[row] = s.observed
        s.mask_marked = s.observed
        self.host_writes += 1
        self._key = None

    def sample_tokens(self, logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> list[int]:
        """``rows`` of ``logits`` (any batch: the host path's steps, a prompt's first token), one sampler
        each, sampled here uncaptured; on the CPU the rows are penalized in place."""
        with torch.inference_mode():  # the forward's logits are inference tensors, changed in place here
            flags = self.prepare(samplers)
            picked = logits if len(rows) == logits.shape[0] else logits[rows]
            width = max(self.fill[s.mask_row] for s in samplers)  # type: ignore[index]
            ids = self.run(picked, self._index, width, flags)
            self.advance_host(samplers)
            return ids.tolist()

    # -- the device's part -----------------------------------------------------------------------------
    def run(self, logits: torch.Tensor, index: torch.Tensor, width: int, flags: SampleFlags) -> torch.Tensor:
        """One token for each row of ``logits`` (``[R, V]``, penalized in place), row ``i`` sampled by the
        state of row ``index[i]``, appended there: the ids ``[R]``, on the device. Reads no host value;
        its shapes depend on ``R`` and ``width`` (the entries of each row's ids it penalizes: at least
        the most any row has) alone."""
        if flags.suppress:
            sup = self.suppressed.index_select(0, index)
            values = logits.gather(1, sup)
            logits.scatter_(1, sup, values.masked_fill(self.suppressing.index_select(0, index), float("-inf")))
        if flags.penalty and width:
            at = self.ids[:, :width].index_select(0, index)
            score = logits.gather(1, at)
            factor = self.factor.index_select(0, index).to(logits.dtype)
            logits.scatter_(1, at, torch.where(score < 0, score * factor, score / factor))
        picked = logits
        advance = self.advance.index_select(0, index)
        if flags.noisy:  # Gumbel-max: argmax(logits / t + g) is drawn from softmax(logits / t)
            noise = gumbel_noise(self.seeds.index_select(0, index), self.drawn.index_select(0, index), self.tokens)
            picked = picked.float().div_(self.temperature.index_select(0, index)).add_(
                noise.mul_(self.noisy.index_select(0, index)))
            self.drawn.index_add_(0, index, advance)
        if picked.device.type == "cpu":  # numpy's vectorized argmax (sampling.argmax_rows)
            ids = torch.from_numpy(picked.numpy().argmax(axis=-1))
        else:
            ids = picked.argmax(dim=-1)
        self.ids.index_put_((index, self.filled.index_select(0, index)), ids)
        self.filled.index_add_(0, index, advance)
        return ids


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)
_GOLDEN2 = _int64((0x9E3779B97F4A7C15**2) % (1 << 64))


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 (torch's is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def gumbel_noise(seeds: torch.Tensor, drawn: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``[rows, vocab]`` (float32), a function of each row's seed, its draw's index and
    the token id alone: splitmix64's finalizer over ``seed * golden + draw * golden^2 + token`` (int64
    arithmetic wraps), its top 24 bits a uniform in (0, 1), then ``-log(-log(u))``."""
    x = seeds.unsqueeze(1) * _GOLDEN + drawn.unsqueeze(1) * _GOLDEN2 + tokens
    x = (x ^ _shift(x, 30)) * _MIX1
    x = (x ^ _shift(x, 27)) * _MIX2
    x = x ^ _shift(x, 31)
    u = _shift(x, 40).float().add_(0.5).mul_(2.0**-24)
    return u.log_().neg_().log_().neg_()
