"""Per-request sampling, incremental detokenization and stop strings, without a model."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference.llm.output import IncrementalDetokenizer, StopChecker, TextOutput
from inference.llm.sampling import (
    RowSampler,
    _greedy_tokens,
    _greedy_tokens_on_device,
    sample_rows,
)


def sampler(**kw):
    args = dict(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0, seed=0, prompt_ids=[])
    args.update(kw)
    return RowSampler(**args)


def test_processors_match_transformers():
    torch.manual_seed(0)
    logits = torch.randn(64) * 3
    prompt = [3, 5, 5, 9, 40]
    s = sampler(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.3, prompt_ids=prompt)
    s.observe(11)
    ids = torch.tensor([prompt + [11]])
    ref = logits.unsqueeze(0)
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(20),
                 TopPLogitsWarper(0.8)):
        ref = proc(ids, ref)
    assert torch.equal(s.process(logits.clone()), ref[0])


def test_greedy_and_penalty():
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0]])
    assert sample_rows(logits, [sampler(temperature=0)]) == [1]
    # token 1 was seen: 5.0 / 2 < 4.9
    assert sample_rows(logits, [sampler(temperature=0, repetition_penalty=2.0, prompt_ids=[1])]) == [2]
    assert sampler(temperature=0.8, top_k=1).greedy


def test_greedy_rows_of_a_batch_equal_each_row_processed_alone():
    """The one-pass greedy path (penalties and suppressed tokens of all rows at once) picks what
    process() + argmax picks row by row, also after tokens are observed and with a sampled row mixed in."""
    torch.manual_seed(3)
    vocab = 500
    samplers = [
        sampler(temperature=0, repetition_penalty=1.3, prompt_ids=[1, 2, 3, 250]),
        sampler(temperature=0),
        sampler(temperature=0, suppress_ids=[7, 8]),
        sampler(temperature=0.9, seed=5, repetition_penalty=1.2, prompt_ids=[4]),
        sampler(temperature=0, repetition_penalty=0.7, prompt_ids=list(range(0, 500, 3)), suppress_ids=[9]),
    ]
    mirrors = [
        sampler(temperature=0, repetition_penalty=1.3, prompt_ids=[1, 2, 3, 250]),
        sampler(temperature=0),
        sampler(temperature=0, suppress_ids=[7, 8]),
        None,
        sampler(temperature=0, repetition_penalty=0.7, prompt_ids=list(range(0, 500, 3)), suppress_ids=[9]),
    ]
    changed = [0] * len(samplers)
    for _ in range(40):
        logits = torch.randn(len(samplers), vocab) * 2
        logits[2, 7] = 50.0  # the suppressed token would win
        batched = sample_rows(logits.clone(), samplers)
        for i, mirror in enumerate(mirrors):
            if mirror is None:
                continue
            alone = int(torch.argmax(mirror.process(logits[i].clone())))
            assert batched[i] == alone
            changed[i] += alone != int(torch.argmax(logits[i]))
            mirror.observe(alone)
        for s, t in zip(samplers, batched):
            s.observe(t)
    # Not vacuous: penalties and suppression did change picks.
    assert changed[0] > 0 and changed[2] == 40 and changed[4] > 0 and changed[1] == 0


def test_greedy_rows_penalized_in_place_equal_each_row_processed_alone():
    """When every row is greedy, sample_rows penalizes the logits in place (no copy); it still picks
    what process() + argmax picks row by row."""
    torch.manual_seed(4)
    for step in range(30):
        samplers = [
            sampler(temperature=0, repetition_penalty=1.1, prompt_ids=list(range(step, 400, 7))),
            sampler(temperature=0, suppress_ids=[5, 6]),
            sampler(temperature=0, repetition_penalty=0.8, prompt_ids=[1, 2, 3], suppress_ids=[4]),
        ]
        logits = torch.randn(3, 400) * 3
        logits[1, 5] = 40.0
        want = [int(torch.argmax(s.process(logits[i].clone()))) for i, s in enumerate(samplers)]
        every = logits.clone()
        assert sample_rows(every, samplers) == want
        assert not torch.equal(every, logits)  # it did work in place


def test_greedy_rows_on_the_device_path_pick_what_the_host_path_picks():
    """The path a GPU takes (penalties as indexed torch operations on the logits' device, one copy of
    the ids back), run here on CPU tensors: the tokens of the numpy path, for rows picked from a
    larger batch and for all rows."""
    torch.manual_seed(5)
    for step in range(20):
        samplers = [
            sampler(temperature=0, repetition_penalty=1.3, prompt_ids=list(range(step, 300, 5))),
            sampler(temperature=0, suppress_ids=[7, 9]),
            sampler(temperature=0, repetition_penalty=0.7, prompt_ids=[1, 2, 3], suppress_ids=[4]),
        ]
        logits = torch.randn(4, 300) * 3
        logits[1, 7] = 50.0
        for rows in ([0, 1, 2], [0, 1, 3]):
            want = _greedy_tokens(logits.clone(), rows, samplers)
            assert _greedy_tokens_on_device(logits.clone(), rows, samplers) == want, (step, rows)


def test_a_failing_row_gets_its_exception_and_the_others_their_tokens():
    logits = torch.tensor([[0.0, 5.0, 1.0], [float("nan"), 1.0, 2.0], [3.0, 0.0, 1.0]])
    out = sample_rows(logits, [sampler(temperature=0), sampler(temperature=1.0), sampler(temperature=0)])
    assert out[0] == 1 and out[2] == 0
    assert isinstance(out[1], RuntimeError)


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    rows = torch.randn(3, 100)

    def draw(batch_rows, seed_row):
        samplers = [sampler(seed=7), sampler(seed=99), sampler(temperature=0)]
        out = []
        for _ in range(20):
            toks = sample_rows(batch_rows, samplers)
            out.append(toks[seed_row])
        return out

    alone = []
    s = sampler(seed=7)
    for _ in range(20):
        alone.append(sample_rows(rows[:1], [s])[0])
    assert draw(rows, 0) == alone
    other = []
    s = sampler(seed=8)
    for _ in range(20):
        other.append(sample_rows(rows[:1], [s])[0])
    assert other != alone


def test_top_p_keeps_the_most_likely_token():
    logits = torch.tensor([10.0, 0.0, 0.0])
    s = sampler(top_p=0.01)
    out = s.process(logits)
    assert out[0] == 10.0 and torch.isinf(out[1:]).all()
    assert all(s.sample(logits) == 0 for _ in range(5))


def test_invalid_params():
    import pytest

    for kw in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            sampler(**kw)


class ByteTokenizer:
    """Each token id is one byte: decode exposes broken UTF-8 as U+FFFD, as byte-level BPE does."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_detokenizer_never_splits_characters():
    text = "héllo → wörld 🙂!"
    data = text.encode()
    d = IncrementalDetokenizer(ByteTokenizer())
    deltas = [d.push(b) for b in data]
    assert "".join(deltas) + d.flush() == text
    assert all("\ufffd" not in x for x in deltas)
    # The emoji is 4 bytes: nothing is released until its last byte.
    i = data.index("🙂".encode())
    assert deltas[i : i + 3] == ["", "", ""] and deltas[i + 3] == "🙂"


class CountingTokenizer:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.decodes = 0

    def decode(self, ids, **kw):
        self.decodes += 1
        return self.inner.decode(ids, **kw)


def _two_decode_deltas(tokenizer, ids: list[int]) -> list[str]:
    """The detokenizer as it was: every token decoded twice (the released window, and it with the new tokens)."""
    def dec(part):
        return tokenizer.decode(part, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    out, prefix, read = [], 0, 0
    for n in range(1, len(ids) + 1):
        prefix_text, new_text = dec(ids[prefix:read]), dec(ids[prefix:n])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            out.append(new_text[len(prefix_text):])
            prefix, read = read, n
        else:
            out.append("")
    prefix_text, new_text = dec(ids[prefix:read]), dec(ids[prefix:])
    out.append(new_text[len(prefix_text):].rstrip("\ufffd") if len(new_text) > len(prefix_text) else "")
    return out


def _metaspace_tokenizer():
    """A sentencepiece-like tokenizer (Llama 2's, Mistral's): words carry a leading '▁' that decoding
    turns into a space, except at the start of what is decoded."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "▁Hello", "▁world", "!", "▁", "é", "▁a", "b", "▁🙂", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok), len(pieces)


def test_detokenizer_decodes_each_token_once_with_the_same_deltas():
    """A token costs one decode (and the window's move one more every WINDOW tokens or so: under
    2 x pushes / WINDOW), where it cost two, and the deltas are the two-decode detokenizer's: byte-level text with multi-byte
    characters split across tokens, and a sentencepiece-like tokenizer that drops a leading space
    where decoding starts."""
    import random

    from benchmarks.synthetic_lm import byte_tokenizer

    rng = random.Random(3)
    text = "héllo → wörld 🙂! 日本語のテキスト, ça va? " * 6
    byte_level = byte_tokenizer(400)
    byte_ids = byte_level.encode(text, add_special_tokens=False)
    meta, n_meta = _metaspace_tokenizer()
    cases = [(ByteTokenizer(), list(text.encode())), (byte_level, byte_ids),
             (byte_level, [rng.randrange(256) for _ in range(300)])]
    cases += [(meta, [rng.randrange(1, n_meta) for _ in range(200)]) for _ in range(3)]
    for tokenizer, ids in cases:
        counting = CountingTokenizer(tokenizer)
        d = IncrementalDetokenizer(counting)
        deltas = [d.push(t) for t in ids] + [d.flush()]
        assert deltas == _two_decode_deltas(tokenizer, ids)
        direct = IncrementalDetokenizer(tokenizer)  # a transformers fast tokenizer: its Rust decode, called directly
        assert (direct._fast is not None) == (tokenizer is not cases[0][0])
        assert [direct.push(t) for t in ids] + [direct.flush()] == deltas
        pushes = len(ids)
        assert counting.decodes <= pushes + 2 * pushes // IncrementalDetokenizer.WINDOW + 2, (counting.decodes, pushes)


def test_detokenizer_flush_drops_incomplete_tail():
    d = IncrementalDetokenizer(ByteTokenizer())
    out = [d.push(b) for b in b"ab" + "🙂".encode()[:2]]
    assert "".join(out) == "ab" and d.flush() == ""


def feed_all(stopper, pieces):
    out, stopped = [], False
    for p in pieces:
        text, stopped = stopper.feed(p)
        out.append(text)
        if stopped:
            break
    return out, stopped


def test_stop_string_across_deltas_is_never_emitted():
    s = StopChecker(("STOP",))
    out, stopped = feed_all(s, ["Hello S", "T", "OP and more"])
    assert stopped and "".join(out) == "Hello "
    assert out[0] == "Hello "  # "S" held back: it could start "STOP"


def test_held_back_text_is_released_when_not_a_stop():
    s = StopChecker(("STOP",))
    out, stopped = feed_all(s, ["ab S", "TO", "x"])
    assert not stopped and "".join(out) == "ab STOx"
    s = StopChecker(("STOP",))
    out, _ = feed_all(s, ["ab ST"])
    assert out == ["ab "] and s.flush() == "ST"


def test_earliest_of_several_stops_wins():
    s = StopChecker(("world", "lo w"))
    out, stopped = feed_all(s, ["hello world"])
    assert stopped and "".join(out) == "hel"
    s = StopChecker(())
    assert feed_all(s, ["a", "b"]) == (["a", "b"], False)


def test_frequency_and_presence_penalties_follow_openai():
    """logit[t] -= count(t) * frequency + (count(t) > 0) * presence, over the generated tokens only."""
    logits = torch.zeros(8)
    logits[2], logits[3] = 5.0, 4.0
    s = sampler(temperature=0.0, frequency_penalty=0.75, presence_penalty=0.5, prompt_ids=[3, 3, 3])
    for token in (2, 2, 5):
        s.observe(token)
    out = s.process(logits.clone())
    assert out[2].item() == 5.0 - 2 * 0.75 - 0.5 and out[5].item() == -0.75 - 0.5
    assert out[3].item() == 4.0  # the prompt's tokens are not penalized (OpenAI's definition)
    assert s.sample(logits.clone()) == 3  # the penalized favourite lost its lead


class OnlyOdd:
    """A constraint that allows odd token ids; records what it was advanced with."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.advanced = vocab, []

    def allowed(self):
        import numpy as np

        return np.arange(self.vocab) % 2 == 1

    def advance(self, token_id: int) -> None:
        self.advanced.append(token_id)


def test_a_constrained_row_is_sampled_alone_and_the_others_keep_theirs():
    torch.manual_seed(1)
    logits = torch.randn(4, 32)
    plain = [sampler(temperature=0.0) for _ in range(3)]
    expected = sample_rows(logits[:3].clone(), plain)
    constraint = OnlyOdd(32)
    rows = [sampler(temperature=0.0), sampler(temperature=0.0, constraint=constraint), *
            [sampler(temperature=0.0) for _ in range(2)]]
    got = sample_rows(torch.cat([logits[:1], logits[3:4], logits[1:3]]).clone(), rows)
    assert [got[0], *got[2:]] == expected
    assert got[1] % 2 == 1 and got[1] == int((logits[3].masked_fill(torch.arange(32) % 2 == 0, float("-inf"))).argmax())
    rows[1].observe(got[1])
    assert constraint.advanced == [got[1]]


def test_probed_tokens_report_their_first_step_probability_before_any_processor():
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0])
    s = sampler(temperature=0.0, repetition_penalty=1.5, prompt_ids=[3], probe_ids=[2, 3])
    assert s.per_row
    sample_rows(logits.unsqueeze(0).clone(), [s])
    expected = torch.softmax(logits, -1)[2:].sum().item()
    assert abs(s.probed - expected) < 1e-6 and not s.per_row  # later steps take the batched path again


def test_a_request_s_text_ends_at_eos_a_stop_string_or_its_limit_with_nothing_held_back_lost():
    def run(output: TextOutput, tokens: bytes) -> tuple[str, str | None, int]:
        text = ""
        for n, token in enumerate(tokens, 1):
            delta, reason = output.accept(token, n)
            text += delta
            if reason is not None:
                return text, reason, n
        return text, None, len(tokens)

    eos = frozenset({0})
    # EOS: the held-back start of a stop string ("EN" of "END") goes out, and the token is not text.
    assert run(TextOutput(ByteTokenizer(), stop=["END"], eos_ids=eos, max_new=50), b"done EN\x00more") == ("done EN", "stop", 8)
    # A stop string: cut before it, what follows never sent.
    assert run(TextOutput(ByteTokenizer(), stop=["END"], eos_ids=eos, max_new=50), b"the ENDing") == ("the ", "stop", 7)
    # The limit: the held-back text goes out ("length"), or a stop string completed by the flush cuts ("stop").
    assert run(TextOutput(ByteTokenizer(), stop=["END"], eos_ids=eos, max_new=6), b"abc EN") == ("abc EN", "length", 6)
    # A character cut in two at the limit is flushed as it decodes.
    assert run(TextOutput(ByteTokenizer(), stop=[], eos_ids=eos, max_new=2), "é!".encode()[:2]) == ("é", "length", 2)
    # EOS ignored: an id in no set is text like any other.
    assert run(TextOutput(ByteTokenizer(), stop=[], eos_ids=frozenset(), max_new=3), b"a\x00b") == ("a\x00b", "length", 3)
