"""Per-request sampling inside a batch (a request's text, from its tokens: output.py).

Each row of a step's logits belongs to one request with its own parameters. The processors follow
transformers' order and definitions (repetition penalty over prompt + generated tokens, temperature,
top-k, top-p), so a request gives the same tokens as ``generate()`` would with the same settings.
OpenAI's presence and frequency penalties (over the generated tokens, as OpenAI and vLLM define them)
and a grammar's mask (constraints.py) come first; a row that has either is sampled on its own, so
the batch's other rows keep the vectorized path.
A seeded request draws from its own ``torch.Generator``, one draw per token, so its output does not
depend on what else runs in the batch; on the static path (a GPU's) a row with a temperature alone is
drawn on the device instead, by Gumbel-max over noise hashed from its seed (:class:`DevicePenalties`),
likewise independent of the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch

from inference.llm.constraints import TokenConstraint


class RowSampler:
    """Sampling state of one request: its parameters, generator and the token ids seen so far."""

    __slots__ = ("temperature", "top_p", "top_k", "repetition_penalty", "generator", "seen", "_seen_ids",
                 "suppress_ids", "_suppress", "presence_penalty", "frequency_penalty", "generated_counts",
                 "constraint", "probe_ids", "probed", "observed", "mask_row", "mask_marked", "seed_value")

    def __init__(
        self,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        repetition_penalty: float,
        seed: int | None,
        prompt_ids: Sequence[int],
        device: torch.device | str = "cpu",
        suppress_ids: Sequence[int] = (),
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        constraint: TokenConstraint | None = None,
        probe_ids: Sequence[int] = (),
    ) -> None:
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if top_k < 0:
            raise ValueError("top_k must be >= 0")
        if repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if not (-2.0 <= presence_penalty <= 2.0 and -2.0 <= frequency_penalty <= 2.0):
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.generated_counts: dict[int, int] = {}  # for the presence and frequency penalties
        self.constraint = constraint
        self.probe_ids = tuple(int(t) for t in probe_ids)  # their probability at the first step is kept
        self.probed: float | None = None
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.repetition_penalty = float(repetition_penalty)
        self.generator: torch.Generator | None = None
        self.seed_value = int(seed) if seed is not None else random.getrandbits(63)  # also DevicePenalties' noise
        if not self.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed_value)
        self.seen: set[int] = set(int(t) for t in prompt_ids) if self.repetition_penalty != 1.0 else set()
        # The seen ids as a tensor too, appended in place: ``_seen_ids[:len(self.seen)]``.
        self._seen_ids = torch.tensor(sorted(self.seen), dtype=torch.long, device=device)
        self.suppress_ids = tuple(int(t) for t in suppress_ids)  # never sampled (e.g. EOS with ignore_eos)
        self._suppress: torch.Tensor | None = None
        self.observed = 0  # tokens observed
        # Its row of a DevicePenalties (the static path's greedy rows), and how many observed tokens it holds.
        self.mask_row: int | None = None
        self.mask_marked = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def device_sampled(self) -> bool:
        """On the static path, sampled by DevicePenalties: greedy, or a temperature alone (no top-k or top-p)."""
        return not self.per_row and (self.greedy or (self.top_k == 0 and self.top_p == 1.0))

    @property
    def per_row(self) -> bool:
        """Sampled on its own: its processors have no vectorized form over the batch."""
        return (self.constraint is not None or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or (bool(self.probe_ids) and self.probed is None))

    def observe(self, token_id: int) -> None:
        self.observed += 1
        if self.constraint is not None:
            self.constraint.advance(token_id)
        if self.presence_penalty != 0.0 or self.frequency_penalty != 0.0:
            self.generated_counts[token_id] = self.generated_counts.get(token_id, 0) + 1
        if self.repetition_penalty != 1.0 and token_id not in self.seen:
            n = len(self.seen)
            if n == self._seen_ids.shape[0]:
                grown = self._seen_ids.new_empty(max(16, 2 * n))
                grown[:n] = self._seen_ids
                self._seen_ids = grown
            self._seen_ids[n] = token_id
            self.seen.add(token_id)

    def seen_ids(self, device: torch.device) -> torch.Tensor:
        if self._seen_ids.device != device:
            self._seen_ids = self._seen_ids.to(device)
        return self._seen_ids[: len(self.seen)]

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """Apply the logits processors to one row (``[V]``, float32); returns the processed row."""
        if self.constraint is not None:
            allowed = torch.from_numpy(self.constraint.allowed()).to(logits.device)
            logits = logits.masked_fill(~allowed[: logits.shape[0]], float("-inf"))
        if self.generated_counts:
            ids = torch.tensor(list(self.generated_counts), dtype=torch.long, device=logits.device)
            counts = torch.tensor(list(self.generated_counts.values()), dtype=logits.dtype, device=logits.device)
            penalty = counts * self.frequency_penalty + self.presence_penalty
            logits = logits.scatter(0, ids, logits.gather(0, ids) - penalty)
        if self.suppress_ids:
            if self._suppress is None or self._suppress.device != logits.device:
                self._suppress = torch.tensor(self.suppress_ids, dtype=torch.long, device=logits.device)
            logits = logits.index_fill(0, self._suppress, float("-inf"))
        if self.repetition_penalty != 1.0 and self.seen:
            ids = self.seen_ids(logits.device)
            score = logits.gather(0, ids)
            p = self.repetition_penalty
            score = torch.where(score < 0, score * p, score / p)
            logits = logits.scatter(0, ids, score)
        if self.greedy:
            return logits
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, sorted_idx = torch.sort(logits, descending=False)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            remove = cum <= (1 - self.top_p)
            remove[-1] = False  # always keep the most likely token
            logits = logits.scatter(0, sorted_idx, sorted_logits.masked_fill(remove, float("-inf")))
        return logits

    def sample(self, logits: torch.Tensor) -> int:
        if self.probe_ids and self.probed is None:
            ids = torch.tensor(self.probe_ids, dtype=torch.long, device=logits.device)
            self.probed = float(torch.softmax(logits.float(), dim=-1)[ids].sum())
        row = self.process(logits)
        if self.greedy:
            return argmax_rows(row.unsqueeze(0))[0]
        probs = torch.softmax(row, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def sample_rows(logits: torch.Tensor, samplers: Sequence[RowSampler],
                masks: DevicePenalties | None = None) -> list[int | Exception]:
    """One token per row of ``logits`` (``[R, V]``), each with its own request's sampler, or the
    exception that row's sampling raised (the other rows still get theirs). On the CPU, the greedy
    rows of ``logits`` are overwritten with their penalized scores. With ``masks`` (the static path's,
    a GPU's), the greedy rows' penalties come from the state it keeps on the device."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(samplers)} samplers")
    out: list[int | Exception] = [0] * len(samplers)
    if masks is not None:  # the static path: greedy rows and rows with a temperature alone on the device
        batched = [i for i, s in enumerate(samplers) if s.device_sampled]
    else:
        batched = [i for i, s in enumerate(samplers) if s.greedy and not s.per_row]
    if batched:
        try:
            rows = [samplers[i] for i in batched]
            picked = masks.sample_tokens(logits, batched, rows) if masks is not None else _greedy_tokens(
                logits, batched, rows)
            for i, t in zip(batched, picked):
                out[i] = t
        except Exception as exc:
            for i in batched:
                out[i] = exc
    done = set(batched)
    for i, s in enumerate(samplers):
        if i not in done:
            try:
                out[i] = s.sample(logits[i])
            except Exception as exc:  # e.g. NaN probabilities from a broken row
                out[i] = exc
    return out


def _greedy_tokens(logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> list[int]:
    """The greedy rows in one numpy pass: every row's suppressed ids to -inf, then every row's seen ids
    penalized as :meth:`RowSampler.process` does (the same float32 arithmetic), each with one indexed
    operation over all rows, then one vectorized argmax. On the CPU in place (no copy of the logits
    when every row is greedy); elsewhere on a host copy of those rows. 8 rows of 49152 logits with
    100 seen ids each: 152 us, of it 35 us the argmax (175 us with numpy's indexed operations row by
    row; in the engine, torch's indexed ops, which copied the logits first, had taken 0.65 ms and torch
    row by row 1.4 ms)."""
    if logits.device.type != "cpu":
        return _greedy_tokens_on_device(logits, rows, samplers)
    scores = logits.numpy()
    picked = scores if len(rows) == scores.shape[0] else scores[rows]
    suppressed: list[np.ndarray] = []
    suppressed_rows: list[int] = []
    seen: list[np.ndarray] = []
    seen_rows: list[int] = []
    penalties: list[float] = []
    for j, s in enumerate(samplers):
        if s.suppress_ids:
            suppressed.append(np.asarray(s.suppress_ids))
            suppressed_rows.append(j)
        if s.repetition_penalty != 1.0 and s.seen:
            seen.append(s.seen_ids(logits.device).numpy())
            seen_rows.append(j)
            penalties.append(s.repetition_penalty)
    if suppressed:
        counts = [len(ids) for ids in suppressed]
        picked[np.repeat(suppressed_rows, counts), np.concatenate(suppressed)] = -np.inf
    if seen:
        counts = [len(ids) for ids in seen]
        at = (np.repeat(seen_rows, counts), np.concatenate(seen))
        factor = np.repeat(np.asarray(penalties, dtype=np.float32), counts)
        values = picked[at]
        picked[at] = np.where(values < 0, values * factor, values / factor)
    return picked.argmax(axis=-1).tolist()


def _greedy_tokens_on_device(logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> list[int]:
    """:func:`_greedy_tokens` where the logits are (a GPU): the same penalties as one indexed operation
    each over all rows on the device, their indices sent in one copy, then one copy of the picked ids
    back to the host instead of the logits (32 rows of a 151936-token vocabulary are 19 MB a step)."""
    dev = logits.device
    picked = logits if len(rows) == logits.shape[0] else logits[rows]
    cpu = torch.device("cpu")
    sup_rows: list[int] = []
    sup_ids: list[torch.Tensor] = []
    pen_rows: list[int] = []
    pen_ids: list[torch.Tensor] = []
    factors: list[float] = []
    for j, s in enumerate(samplers):
        if s.suppress_ids:
            sup_rows += [j] * len(s.suppress_ids)
            sup_ids.append(torch.as_tensor(s.suppress_ids, dtype=torch.long))
        if s.repetition_penalty != 1.0 and s.seen:
            ids = s.seen_ids(cpu)
            pen_rows += [j] * len(ids)
            pen_ids.append(ids)
            factors += [s.repetition_penalty] * len(ids)
    if sup_ids:
        at = torch.stack([torch.tensor(sup_rows), torch.cat(sup_ids)]).to(dev, non_blocking=True)
        picked[at[0], at[1]] = float("-inf")
    if pen_ids:
        at = torch.stack([torch.tensor(pen_rows), torch.cat(pen_ids)]).to(dev, non_blocking=True)
        factor = torch.tensor(factors, dtype=picked.dtype).to(dev, non_blocking=True)
        values = picked[at[0], at[1]]
        picked[at[0], at[1]] = torch.where(values < 0, values * factor, values / factor)
    return picked.argmax(dim=-1).tolist()


class DevicePenalties:
    """The static path's (a GPU's) rows sampled on the logits' device, their penalties' state kept there:
    greedy rows, and rows with a temperature alone (``RowSampler.device_sampled``), drawn by Gumbel-max
    with noise hashed from the request's seed, its draw's index and the token id (:func:`gumbel_noise`),
    so that a request's tokens do not depend on its batch and no generator runs per row. Each
    sampler that comes here gets a row of ``ids``: the ids it has seen (its prompt's where it has a
    repetition penalty), then every token it samples, appended on the device by the step that samples
    it; the rest of the row repeats its first entry (0 where it has none: a factor of 1 writes the
    value back), and a row's suppressed ids are a row of ``suppressed`` likewise. A step gathers its rows' logits at those ids, penalizes them (the same
    float32 arithmetic as :meth:`RowSampler.process`; a repeated id gets the same value twice) and
    scatters them back, takes the argmax and appends it: a fixed dozen operations on the host whatever
    the rows have seen, over rows x seen ids on the device (not the vocabulary). Before, every row's
    seen ids were gathered into lists and copied to the device each step. A sampler's row is written
    from the host once, when it first comes (again only if it observed a token another path sampled);
    the batch's row indices and penalties are copied again only when the batch changes. :meth:`release`
    hands a finished request's row back."""

    def __init__(self, rows: int, device: torch.device | str, width: int = 256) -> None:
        self.device = torch.device(device)
        self.ids = torch.zeros((rows, width), dtype=torch.long, device=self.device)
        self.filled = torch.zeros(rows, dtype=torch.long, device=self.device)  # entries of each row
        self.fill = [0] * rows  # the same, as the host knows it
        self.suppressed = torch.zeros((rows, 1), dtype=torch.long, device=self.device)
        self.suppressing = torch.zeros((rows, 1), dtype=torch.bool, device=self.device)  # entry is an id
        self._free = list(range(rows - 1, -1, -1))
        self._key: tuple[int, ...] | None = None
        self.seeds = torch.zeros(rows, dtype=torch.long, device=self.device)  # each row's request's seed
        self.drawn = torch.zeros(rows, dtype=torch.long, device=self.device)  # tokens it drew so far
        self._index = self._factor = self._ones = self._sup_ids = self._sup_real = torch.empty(0)
        self._temperature = self._noisy = self._tokens = torch.empty(0)
        self._any_suppressed = self._any_penalty = self._any_sampled = False
        self.host_writes = 0  # rows written from the host (a sampler's first step, or a resync)

    def release(self, sampler: RowSampler) -> None:
        if sampler.mask_row is not None:
            self._free.append(sampler.mask_row)
            sampler.mask_row = None
            self._key = None

    def _grow(self, rows: int = 0, width: int = 0, suppressed: int = 0) -> None:
        """Room for ``rows`` more rows, ``width`` ids a row and ``suppressed`` suppressed ids a row."""
        if rows:
            n = self.ids.shape[0]
            self.ids = torch.cat([self.ids, torch.zeros_like(self.ids[:rows])])
            self.filled = torch.cat([self.filled, torch.zeros_like(self.filled[:rows])])
            self.suppressed = torch.cat([self.suppressed, torch.zeros_like(self.suppressed[:rows])])
            self.suppressing = torch.cat([self.suppressing, torch.zeros_like(self.suppressing[:rows])])
            self.seeds = torch.cat([self.seeds, torch.zeros_like(self.seeds[:rows])])
            self.drawn = torch.cat([self.drawn, torch.zeros_like(self.drawn[:rows])])
            self.fill += [0] * rows
            self._free = list(range(n + rows - 1, n - 1, -1)) + self._free
        while width > self.ids.shape[1]:  # new columns repeat each row's first id
            self.ids = torch.cat([self.ids, self.ids[:, :1].expand(-1, self.ids.shape[1])], dim=1)
        if suppressed > self.suppressed.shape[1]:
            extra = suppressed - self.suppressed.shape[1]
            self.suppressed = torch.cat([self.suppressed, self.suppressed[:, :1].expand(-1, extra)], dim=1)
            self.suppressing = torch.cat([self.suppressing, self.suppressing[:, :1].expand(-1, extra)], dim=1)
        self._key = None

    def _attach(self, s: RowSampler) -> None:
        if s.mask_row is None:
            if not self._free:  # more samplers than rows (none released yet)
                self._grow(rows=self.ids.shape[0])
            s.mask_row = self._free.pop()
            self._key = None
        row = s.mask_row
        seen = s.seen_ids(torch.device("cpu")) if s.repetition_penalty != 1.0 else torch.empty(0, dtype=torch.long)
        n = int(seen.shape[0])
        self._grow(width=n + 1, suppressed=len(s.suppress_ids))
        line = torch.full((self.ids.shape[1],), int(seen[0]) if n else 0, dtype=torch.long)
        line[:n] = seen
        self.ids[row].copy_(line.to(self.device))
        self.filled[row] = n
        self.fill[row] = n
        sup = torch.full((self.suppressed.shape[1],), s.suppress_ids[0] if s.suppress_ids else 0, dtype=torch.long)
        sup[: len(s.suppress_ids)] = torch.tensor(s.suppress_ids, dtype=torch.long)
        # A row with suppressed ids repeats its first one (and suppresses it again: one value per id).
        real = torch.full((self.suppressed.shape[1],), bool(s.suppress_ids), dtype=torch.bool)
        self.suppressed[row].copy_(sup.to(self.device))
        self.suppressing[row].copy_(real.to(self.device))
        self.seeds[row] = s.seed_value & (2**62 - 1)
        self.drawn[row] = s.observed
        s.mask_marked = s.observed
        self.host_writes += 1
        self._key = None

    def sample_tokens(self, logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> list[int]:
        return self.sample_ids(logits, rows, samplers).tolist()

    def sample_ids(self, logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> torch.Tensor:
        """The rows' tokens as a tensor on the logits' device (no wait for the device): a step launched
        before the host has read them takes them as its inputs (overlap.py). Each sampler's row holds
        them at once; the engine observes them later (``mask_marked`` counts both)."""
        with torch.inference_mode():  # the forward's logits are inference tensors, changed in place here
            return self._sample_ids(logits, rows, samplers)

    def _sample_ids(self, logits: torch.Tensor, rows: list[int], samplers: list[RowSampler]) -> torch.Tensor:
        for s in samplers:
            # Its row lacks a token it observed (sampled on another path): written again from the host.
            if s.mask_row is None or s.mask_marked < s.observed:
                self._attach(s)
        key = tuple(s.mask_row for s in samplers if s.mask_row is not None)  # every one has its row now
        width = max(self.fill[r] for r in key)
        if width + 1 > self.ids.shape[1]:
            self._grow(width=width + 1)
        if key != self._key:
            self._key = key
            self._index = torch.tensor(key, dtype=torch.long).to(self.device, non_blocking=True)
            self._factor = torch.tensor([[s.repetition_penalty] for s in samplers], dtype=torch.float32).to(
                self.device, non_blocking=True)
            self._ones = torch.ones(len(key), dtype=torch.long, device=self.device)
            self._any_suppressed = any(s.suppress_ids for s in samplers)
            self._any_penalty = any(s.repetition_penalty != 1.0 for s in samplers)
            self._any_sampled = any(not s.greedy for s in samplers)
            if self._any_sampled:  # a greedy row: divided by 1, no noise
                self._temperature = torch.tensor([[1.0 if s.greedy else s.temperature] for s in samplers],
                                                 dtype=torch.float32).to(self.device, non_blocking=True)
                self._noisy = torch.tensor([[0.0 if s.greedy else 1.0] for s in samplers],
                                           dtype=torch.float32).to(self.device, non_blocking=True)
            if self._any_suppressed:
                self._sup_ids = self.suppressed.index_select(0, self._index)
                self._sup_real = self.suppressing.index_select(0, self._index)
        # In place where every row is greedy (no copy of the logits), as the host path does.
        picked = logits if len(rows) == logits.shape[0] else logits[rows]
        if self._any_suppressed:
            values = picked.gather(1, self._sup_ids)
            picked.scatter_(1, self._sup_ids, values.masked_fill(self._sup_real, float("-inf")))
        if self._any_penalty and width:
            at = self.ids[:, :width].index_select(0, self._index)
            score = picked.gather(1, at)
            factor = self._factor.to(picked.dtype)
            picked.scatter_(1, at, torch.where(score < 0, score * factor, score / factor))
        if self._any_sampled:  # Gumbel-max: argmax(logits / t + g) is drawn from softmax(logits / t)
            if self._tokens.shape[0] != picked.shape[1]:
                self._tokens = torch.arange(picked.shape[1], device=self.device)
            noise = gumbel_noise(self.seeds.index_select(0, self._index), self.drawn.index_select(0, self._index),
                                 self._tokens)
            picked = picked.float().div_(self._temperature).add_(noise.mul_(self._noisy))
            self.drawn.index_add_(0, self._index, self._ones)
        if picked.device.type == "cpu":  # numpy's vectorized argmax (see argmax_rows)
            ids = torch.from_numpy(picked.numpy().argmax(axis=-1))
        else:
            ids = picked.argmax(dim=-1)
        self.ids.index_put_((self._index, self.filled.index_select(0, self._index)), ids)
        self.filled.index_add_(0, self._index, self._ones)
        for s in samplers:  # the engine observes each picked token later
            self.fill[s.mask_row] += 1  # type: ignore[index]
            s.mask_marked += 1
        return ids


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 (torch's is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def gumbel_noise(seeds: torch.Tensor, drawn: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``[rows, vocab]`` (float32), a function of each row's seed, its draw's index and
    the token id alone: splitmix64's finalizer over ``seed * golden + draw * golden^2 + token`` (int64
    arithmetic wraps), its top 24 bits a uniform in (0, 1), then ``-log(-log(u))``."""
    x = seeds.unsqueeze(1) * _GOLDEN + drawn.unsqueeze(1) * _int64((0x9E3779B97F4A7C15 ** 2) % (1 << 64)) + tokens
    x = (x ^ _shift(x, 30)) * _MIX1
    x = (x ^ _shift(x, 27)) * _MIX2
    x = x ^ _shift(x, 31)
    u = _shift(x, 40).float().add_(0.5).mul_(2.0**-24)
    return u.log_().neg_().log_().neg_()


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first maximal index. On the CPU through numpy, whose argmax is vectorized: 63 us for
    8 x 49152 here, against 425-815 us for torch.argmax."""
    if logits.device.type == "cpu":
        return logits.numpy().argmax(axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()
