"""The static path's sampling on the device (device_sampler.py), on the CPU: the step a CUDA graph captures."""

from __future__ import annotations

import pytest
import torch

from inference.llm.device_sampler import ALL_FLAGS, DeviceSampler, gumbel_noise
from inference.llm.sampling import RowSampler, _greedy_tokens, sample_rows


def sampler(**kw):
    args = dict(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0, seed=0, prompt_ids=[])
    args.update(kw)
    return RowSampler(**args)


def test_penalties_kept_on_the_device_pick_what_the_seen_id_lists_pick():
    """Penalties as per-row ids on the device, each sampled token appended there, give the tokens of the
    host path, which builds every row's seen ids a step: over 40 steps of rows that come and go (a
    finished row's state row goes to the next), a penalty above and below 1, suppressed ids, rows
    without either, a row sampled elsewhere for a step (its row written again), and logits that make
    repeating a token tempting. Its rows are written from the host once each, not every step."""
    torch.manual_seed(11)
    V = 300
    masks = DeviceSampler(4, 128, V, "cpu")
    specs = [dict(repetition_penalty=1.3, prompt_ids=list(range(0, 300, 7))), dict(suppress_ids=[7, 9]),
             dict(repetition_penalty=0.7, prompt_ids=[1, 2, 3], suppress_ids=[4]), dict(),
             dict(repetition_penalty=1.1, prompt_ids=[5, 5, 6])]
    pairs = [(sampler(temperature=0, **kw), sampler(temperature=0, **kw)) for kw in specs[:3]]
    writes = 0
    for step in range(40):
        if step == 10:  # a row finishes, two come
            masks.release(pairs.pop(1)[0])
            pairs += [(sampler(temperature=0, **kw), sampler(temperature=0, **kw)) for kw in specs[3:]]
        logits = torch.randn(len(pairs) + 1, V) * 2
        logits[:, 40 + step % 3] += 4.0  # a few tokens come back again and again: the penalty decides
        rows = list(range(len(pairs))) if step % 2 else list(range(1, len(pairs) + 1))
        if step == 20:  # the first row is sampled on its own path this step (not through the masks)
            mine = masks.sample_tokens(logits.clone(), rows[1:], [p[0] for p in pairs[1:]])
            mine.insert(0, int(torch.argmax(pairs[0][0].process(logits[rows[0]].clone()))))
        else:
            mine = masks.sample_tokens(logits.clone(), rows, [p[0] for p in pairs])
        want = _greedy_tokens(logits.clone(), rows, [p[1] for p in pairs])
        assert mine == want, step
        for (a, b), tok in zip(pairs, want):
            a.observe(tok)
            b.observe(tok)
        writes = masks.host_writes
    assert writes == len(specs) + 1  # each sampler's first step, and the row sampled elsewhere


def test_the_captured_step_over_the_whole_width_and_padding_rows_samples_as_the_narrow_one():
    """A captured sampling step gathers every row's ids over the sampler's whole width and runs over the
    batch bucket's rows in slot order, padding rows pointing at the scratch row: it gives the real rows
    the tokens, and leaves them the state, of the step over the ids they hold, and the scratch row never
    advances (its ids stay in bounds however many steps pad)."""
    torch.manual_seed(5)
    V, width = 80, 64
    specs = [dict(temperature=0.0, repetition_penalty=1.4, prompt_ids=[1, 2, 3, 40], suppress_ids=[5]),
             dict(temperature=0.8, seed=9, repetition_penalty=0.8, prompt_ids=[7]),
             dict(temperature=1.2, seed=4)]
    narrow, wide = DeviceSampler(4, width, V, "cpu"), DeviceSampler(4, width, V, "cpu")
    rows_n = [sampler(**kw) for kw in specs]
    rows_w = [sampler(**kw) for kw in specs]
    for step in range(30):
        logits = torch.randn(3, V) * 2
        logits[:, 40 + step % 2] += 3.0
        got_n = narrow.sample_tokens(logits.clone(), [0, 1, 2], rows_n)
        flags = wide.prepare(rows_w)
        assert flags in ALL_FLAGS and flags.suppress and flags.penalty and flags.noisy
        # Bucket 4 in slot order: the requests sit in slots 0, 2 and 3; slot 1 pads.
        bucket = torch.randn(4, V)
        bucket[[0, 2, 3]] = logits
        index = torch.tensor([rows_w[0].mask_row, wide.scratch, rows_w[1].mask_row, rows_w[2].mask_row])
        ids = wide.run(bucket, index, wide.width, flags)
        wide.advance_host(rows_w)
        got_w = ids[[0, 2, 3]].tolist()
        assert got_w == got_n, step
        for a, b, t in zip(rows_n, rows_w, got_n):
            a.observe(t)
            b.observe(t)
    assert len(set(t for t in got_n)) > 1
    for a, b in zip(rows_n, rows_w):
        assert torch.equal(narrow.ids[a.mask_row], wide.ids[b.mask_row])
        assert narrow.filled[a.mask_row] == wide.filled[b.mask_row] == narrow.fill[a.mask_row]
        assert narrow.drawn[a.mask_row] == wide.drawn[b.mask_row]
    assert int(wide.filled[wide.scratch]) == 0 and int(wide.drawn[wide.scratch]) == 0


def test_a_sampler_refuses_more_rows_or_longer_contexts_than_it_holds():
    masks = DeviceSampler(2, 8, 50, "cpu")
    masks.prepare([sampler(temperature=0), sampler(temperature=0)])
    with pytest.raises(RuntimeError, match="rows"):
        masks.prepare([sampler(temperature=0)])
    long = sampler(temperature=0, repetition_penalty=1.2, prompt_ids=list(range(8)))
    with pytest.raises(RuntimeError, match="width"):
        DeviceSampler(2, 8, 50, "cpu").prepare([long])
    grown = sampler(temperature=0, repetition_penalty=1.2, prompt_ids=list(range(6)))
    masks = DeviceSampler(1, 8, 50, "cpu")
    logits = torch.zeros(1, 50)
    logits[0, 30] = 1.0
    masks.sample_tokens(logits.clone(), [0], [grown])  # its 7th id
    grown.observe(30)
    masks.sample_tokens(logits.clone(), [0], [grown])  # its 8th
    grown.observe(30)
    with pytest.raises(RuntimeError, match="width"):
        masks.sample_tokens(logits.clone(), [0], [grown])
    with pytest.raises(ValueError, match="device"):
        DeviceSampler(1, 8, 50, "cpu").prepare([sampler(temperature=0.9, top_p=0.9)])


def test_hashed_gumbel_noise_draws_from_the_softmax_over_seeds_and_over_draws():
    """argmax(logits / t + noise) over 4000 seeds (one draw each), and over 4000 draws of one seed, gives
    each token with softmax(logits / t)'s probability (within 0.03: four standard deviations); a seed and
    a draw's index give the same noise each time, another index other noise."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5, 0.2, -0.5])
    t = 0.7
    want = torch.softmax(logits / t, -1)
    tokens = torch.arange(8)
    n = 4000
    for seeds, drawn in ((torch.arange(n), torch.zeros(n, dtype=torch.long)),
                         (torch.full((n,), 12345), torch.arange(n))):
        picks = (logits / t + gumbel_noise(seeds, drawn, tokens)).argmax(-1)
        freq = torch.bincount(picks, minlength=8).float() / n
        assert (freq - want).abs().max().item() < 0.03, (freq, want)
    once = gumbel_noise(torch.tensor([7]), torch.tensor([3]), tokens)
    assert torch.equal(once, gumbel_noise(torch.tensor([7]), torch.tensor([3]), tokens))
    assert not torch.equal(once, gumbel_noise(torch.tensor([7]), torch.tensor([4]), tokens))
    assert torch.isfinite(once).all()


def test_temperature_rows_on_the_device_follow_their_seed_whatever_the_batch():
    """The static path samples a temperature row on the device: a seeded request draws the same tokens
    alone and beside other rows (greedy or sampled, in another order), a greedy row beside it keeps the
    host path's argmax, and a row with top-p is left to its own sampler."""
    torch.manual_seed(3)
    steps = [torch.randn(4, 50) * 2 for _ in range(12)]

    def run(batch: list[int]) -> list[list[int]]:
        masks = DeviceSampler(4, 32, 50, "cpu")
        samplers = {0: sampler(temperature=0.8, seed=42, repetition_penalty=1.2, prompt_ids=[1, 2]),
                    1: sampler(temperature=0.0, repetition_penalty=1.2, prompt_ids=[3]),
                    2: sampler(temperature=1.3, seed=7), 3: sampler(temperature=0.9, top_p=0.9, seed=1)}
        out: list[list[int]] = [[] for _ in batch]
        for logits in steps:
            rows = [samplers[i] for i in batch]
            got = sample_rows(logits[batch].clone(), rows, masks)
            for j, (row, token) in enumerate(zip(rows, got)):
                out[j].append(token)
                row.observe(token)
        return out

    alone = run([0])[0]
    assert run([0, 1, 2])[0] == alone and run([2, 3, 0])[2] == alone
    assert len(set(alone)) > 1  # sampled, not argmax every time
    greedy = sampler(temperature=0.0, repetition_penalty=1.2, prompt_ids=[3])
    want = []
    for logits in steps:
        want.append(_greedy_tokens(logits[1:2].clone(), [0], [greedy])[0])
        greedy.observe(want[-1])
    assert run([0, 1, 2])[1] == want
    assert not sampler(temperature=0.9, top_p=0.9).device_sampled and sampler(temperature=0.9).device_sampled
    assert not sampler(temperature=0, suppress_ids=list(range(9))).device_sampled
