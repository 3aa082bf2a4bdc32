"""Solo against batched runs of the lean forward, for the correctness tests of every path.

A request's logits must not depend on what else its steps hold. The batched run mixes everything the
engine does in one step: decoding rows of slots that are not ``0..used-1`` (the padded, masked sdpa
call), prompt chunks after a first chunk (a causal mask with an offset), and prompts of different
lengths. Every token is fed from a fixed list (teacher forcing), so the two runs see the same inputs
whatever their argmax, and their logits can be compared step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.llm.forward import LeanForward
from inference.llm.kv_manager import KVPool
from inference.llm.step_plan import Segment

PROMPT_LENGTHS = (37, 5, 90, 12)
CHUNK = 16


@dataclass
class Workload:
    prompts: list[torch.Tensor]
    feeds: list[torch.Tensor]  # the tokens fed after each prompt, one per decoding step

    @classmethod
    def random(cls, vocab: int, steps: int = 10, seed: int = 1) -> Workload:
        g = torch.Generator().manual_seed(seed)
        return cls([torch.randint(0, vocab, (n,), generator=g) for n in PROMPT_LENGTHS],
                   [torch.randint(0, vocab, (steps,), generator=g) for _ in PROMPT_LENGTHS])


def with_clear_steps(fwd: LeanForward, work: Workload, bound: float, *, batch: int = 4, rounds: int = 4,
                     margin: float = 1.25, seed: int = 2) -> Workload:
    """``work`` with tokens replaced so that each request's solo run on ``fwd`` has clear steps.

    A step is clear where its top two logits lie more than ``2 * bound`` of the logits' scale apart:
    a difference of ``bound`` in each cannot swap them, so the greedy tokens alone and batched must
    agree there. Random weights give flat logits, the top two of the vocabulary's draws close
    together, and the larger the vocabulary, the fewer clear steps random tokens give: of the 44
    steps of ``Workload.random`` at the bfloat16 bound (2^-5) on this CPU, 19 for the 135M shape, 12
    for the 3B one and 8 for the 1.5B one. So each token that decides a step (the prompt's last, then
    each fed one) is run as ``run_solo`` runs it; where its step is not clear by ``margin`` times that
    (the scale may still grow), up to ``rounds`` batches of ``batch`` random tokens are tried in one
    step each, over copies of the request's KV, and the first clear one (else the clearest) is run
    alone in its place. So the solo run of the result is the one whose steps were judged."""
    g = torch.Generator().manual_seed(seed)
    picked = [_pick_clear_tokens(fwd, torch.cat([p, f]), len(p), bound * margin, g, batch, rounds)
              for p, f in zip(work.prompts, work.feeds)]
    return Workload([seq[: len(p)] for seq, p in zip(picked, work.prompts)],
                    [seq[len(p) :] for seq, p in zip(picked, work.prompts)])


def _solo_step(fwd: LeanForward, pool: KVPool, tokens: torch.Tensor, n: int, pos: int) -> torch.Tensor:
    """The logits of position ``pos`` of a request alone in slot 0, as run_solo computes them: the
    whole prompt (``n`` tokens) in one step at ``n - 1``, one token a step after it."""
    dev = fwd.device
    if pos == n - 1:
        return fwd.forward(pool, tokens[:n].to(dev), torch.arange(n, device=dev), [Segment(0, 0, n)], [n - 1]).cpu()
    return fwd.forward(pool, tokens[pos : pos + 1].to(dev), torch.tensor([pos], device=dev),
                       [Segment(0, pos, 1)], [0]).cpu()


def _apart(logits: torch.Tensor, scale: float, bound: float) -> torch.Tensor:
    """Each row's top two logits' distance in units of ``2 * bound`` of its scale (at least ``scale``)."""
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]) / logits.abs().amax(-1).clamp(min=scale) / (2 * bound)


def _pick_clear_tokens(fwd: LeanForward, tokens: torch.Tensor, n: int, bound: float, g: torch.Generator,
                       batch: int, rounds: int) -> torch.Tensor:
    """A copy of one request's sequence (its prompt's ``n`` tokens, then its fed ones) whose tokens
    from position ``n - 1`` on are replaced where their step was not clear (see with_clear_steps)."""
    tokens = tokens.clone()
    dev = fwd.device
    pool = _pool(fwd, 1 + batch, len(tokens))
    scale = 0.0
    for pos in range(n - 1, len(tokens)):
        logits = _solo_step(fwd, pool, tokens, n, pos)
        best, best_apart = int(tokens[pos]), _apart(logits, scale, bound).item()
        if best_apart <= 1:
            for _ in range(rounds):
                for slot in range(1, 1 + batch):
                    pool.write(slot, 0, pool.view(0, 0, pos))
                tried = torch.randint(0, fwd.vocab_size, (batch,), generator=g)
                out = fwd.forward(pool, tried.to(dev), torch.full((batch,), pos, device=dev),
                                  [Segment(1 + j, pos, 1) for j in range(batch)], range(batch)).cpu()
                score = _apart(out, scale, bound)
                if score.max().item() > best_apart:
                    best, best_apart = int(tried[int(score.argmax())]), score.max().item()
                if best_apart > 1:
                    break
            tokens[pos] = best
            logits = _solo_step(fwd, pool, tokens, n, pos)
        scale = max(scale, logits.abs().max().item())
    return tokens


def full_pool(fwd: LeanForward, slots: int, capacity: int = 256) -> KVPool:
    """A KV pool whose ``slots`` slots are all taken (slot i for request i)."""
    pool = KVPool(fwd.kv_layout, slots, max_capacity=2048, capacity=capacity)
    for _ in range(slots):
        pool.acquire()
    return pool


def _pool(fwd: LeanForward, slots: int, longest: int) -> KVPool:
    return full_pool(fwd, slots, max(256, longest))


def run_solo(fwd: LeanForward, work: Workload, i: int) -> torch.Tensor:
    """Request ``i`` alone: its prompt in one step, then one token a step. ``[steps + 1, vocab]``, in the
    forward's ``logits_dtype`` (float64 stays float64)."""
    prompt, feed = work.prompts[i], work.feeds[i]
    dev = fwd.device
    pool = _pool(fwd, 1, len(prompt) + len(feed))
    n = len(prompt)
    out = [fwd.forward(pool, prompt.to(dev), torch.arange(n, device=dev), [Segment(0, 0, n)], [n - 1])[0]]
    for t in range(len(feed)):
        pos = torch.tensor([n + t], device=dev)
        out.append(fwd.forward(pool, feed[t : t + 1].to(dev), pos, [Segment(0, n + t, 1)], [0])[0])
    return torch.stack(out).cpu()


def run_batched(fwd: LeanForward, work: Workload, position_offset: int = 0) -> list[torch.Tensor]:
    """All requests in shared steps: the first two prefill together and then decode, while the others
    prefill in chunks of CHUNK beside them and then decode too. ``position_offset`` shifts one
    request's positions (only to show that the comparison catches such a defect)."""
    dev = fwd.device
    count = len(work.prompts)
    pool = _pool(fwd, count, max(len(p) + len(f) for p, f in zip(work.prompts, work.feeds)))
    outs: list[list[torch.Tensor]] = [[] for _ in range(count)]
    decoded = {0: 0, 1: 0}  # request -> tokens fed so far
    prefilled = {i: 0 for i in range(2, count)}
    n0, n1 = len(work.prompts[0]), len(work.prompts[1])
    first = fwd.forward(pool, torch.cat(work.prompts[:2]).to(dev),
                        torch.cat([torch.arange(n0), torch.arange(n1)]).to(dev),
                        [Segment(0, 0, n0), Segment(1, 0, n1)], [n0 - 1, n0 + n1 - 1])
    outs[0].append(first[0])
    outs[1].append(first[1])
    while any(len(o) < len(work.feeds[i]) + 1 for i, o in enumerate(outs)):
        segments, ids, positions, rows, owners = [], [], [], [], []
        for i in sorted(decoded):
            t = decoded[i]
            if t >= len(work.feeds[i]):
                continue
            pos = len(work.prompts[i]) + t + (position_offset if i == 1 else 0)
            segments.append(Segment(i, len(work.prompts[i]) + t, 1))
            ids.append(work.feeds[i][t : t + 1])
            positions.append(torch.tensor([pos]))
            rows.append(len(segments) - 1)
            owners.append(i)
            decoded[i] = t + 1
        row = len(segments)
        for i in list(prefilled):
            start = prefilled[i]
            m = min(CHUNK, len(work.prompts[i]) - start)
            segments.append(Segment(i, start, m))
            ids.append(work.prompts[i][start : start + m])
            positions.append(torch.arange(start, start + m))
            row += m
            prefilled[i] = start + m
            if prefilled[i] == len(work.prompts[i]):
                rows.append(row - 1)
                owners.append(i)
                decoded[i] = 0
                del prefilled[i]
        logits = fwd.forward(pool, torch.cat(ids).to(dev), torch.cat(positions).to(dev), segments, rows)
        for r, i in enumerate(owners):
            outs[i].append(logits[r])
    return [torch.stack(o).cpu() for o in outs]


def reference_logits(model: torch.nn.Module, work: Workload, i: int) -> torch.Tensor:
    """transformers' own forward over request ``i``'s whole sequence, at the positions where the
    engine samples: the last prompt token and every fed token."""
    seq = torch.cat([work.prompts[i], work.feeds[i]]).unsqueeze(0).to(model.device)
    with torch.inference_mode():
        logits = model(seq).logits[0]
    return logits[len(work.prompts[i]) - 1 :].double().cpu()


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def first_near_tie(logits: torch.Tensor, bound: float) -> int:
    """The first step whose top two logits are within ``2 * bound``: where a difference of ``bound``
    in each may swap the argmax. ``len(logits)`` if there is none."""
    top2 = logits.topk(2, dim=-1).values
    close = ((top2[:, 0] - top2[:, 1]) <= 2 * bound).nonzero()
    return int(close[0]) if len(close) else len(logits)
