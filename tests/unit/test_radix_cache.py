"""Radix prefix cache, without a model: KV tensors whose values are the token ids they stand for, held
in a token store whose capacity is the budget."""

from __future__ import annotations

import torch

from inference.llm.radix_cache import PrefixCache
from inference.llm.token_store import TokenKVStore

BYTES_PER_TOKEN = 4 * 2  # float32, shape [1, 2, n]


def kv_of(tokens):
    """A fake KV for ``tokens``: [1, 2, n] float32, token dim 2; values identify the tokens."""
    t = torch.tensor(tokens, dtype=torch.float32)
    return torch.stack([t, -t]).unsqueeze(0)


def source(tokens):
    full = kv_of(tokens)
    return lambda a, b: full[:, :, a:b]


def gathered(cache, match):
    pieces = cache.read(match)
    return torch.cat(pieces, dim=2) if pieces else torch.empty(1, 2, 0)


def make(budget=1 << 20):
    return PrefixCache(TokenKVStore((1, 2), 2, budget // BYTES_PER_TOKEN, torch.float32))


def test_match_empty_and_miss():
    c = make()
    m = c.match([1, 2, 3])
    assert m.length == 0 and m.parts == []
    assert c.stats.misses == 1 and c.stats.miss_tokens == 3


def test_insert_and_longest_prefix_at_token_granularity():
    c = make()
    a = [1, 2, 3, 4, 5, 6]
    c.insert(a, source(a))
    m = c.match([1, 2, 3, 9, 9])
    assert m.length == 3
    assert torch.equal(gathered(c, m), kv_of([1, 2, 3]))
    m = c.match(a + [7, 8])
    assert m.length == 6
    assert torch.equal(gathered(c, m), kv_of(a))
    assert c.match(a, max_length=4).length == 4
    assert c.stats.hits == 3 and c.stats.hit_tokens == 3 + 6 + 4


def test_split_keeps_contents_and_pins():
    c = make()
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 7, 8]
    na = c.insert(a, source(a), pin=True)
    nb = c.insert(b, source(b))
    assert c.num_nodes == 3  # [1,2,3] -> {[4,5,6], [7,8]}
    assert c.num_tokens == 8 and c.bytes_used == 8 * BYTES_PER_TOKEN
    assert na.pins == 1 and na.key == (4, 5, 6) and nb.key == (7, 8)
    for seq in (a, b):
        m = c.match(seq)
        assert m.length == len(seq)
        assert torch.equal(gathered(c, m), kv_of(seq))
    # Inserting a sequence that is already cached adds nothing.
    before = c.bytes_used
    end = c.insert([1, 2, 3, 4], source([1, 2, 3, 4]))
    assert end is na and c.bytes_used == before


def test_lru_eviction_under_budget():
    c = make(budget=10 * BYTES_PER_TOKEN)
    c.insert([1, 2, 3, 4], source([1, 2, 3, 4]))
    c.insert([5, 6, 7, 8], source([5, 6, 7, 8]))
    c.match([1, 2, 3, 4])  # touch: [5..8] is now the least recently used
    c.insert([9, 10, 11, 12], source([9, 10, 11, 12]))
    assert c.bytes_used <= 10 * BYTES_PER_TOKEN
    assert c.match([5, 6, 7, 8]).length == 0
    assert c.match([1, 2, 3, 4]).length == 4
    assert c.match([9, 10, 11, 12]).length == 4
    assert c.stats.evictions == 1 and c.stats.evicted_tokens == 4


def test_eviction_walks_up_to_parents():
    c = make(budget=100 * BYTES_PER_TOKEN)
    c.insert([1, 2, 3, 4], source([1, 2, 3, 4]))
    c.insert([1, 2, 5, 6], source([1, 2, 5, 6]))
    c.evict(c.bytes_used)
    assert c.bytes_used == 0 and c.num_nodes == 0 and c.num_tokens == 0
    assert c.match([1, 2]).length == 0


def test_pinned_evicted_last():
    c = make(budget=8 * BYTES_PER_TOKEN)
    pinned = c.insert([1, 2, 3, 4], source([1, 2, 3, 4]), pin=True)
    c.insert([5, 6, 7, 8], source([5, 6, 7, 8]))
    c.match([5, 6, 7, 8])  # most recent, but not pinned
    c.insert([9, 10, 11, 12], source([9, 10, 11, 12]))
    assert c.match([1, 2, 3, 4]).length == 4
    assert c.match([5, 6, 7, 8]).length == 0
    assert c.is_cached(pinned)
    c.unpin(pinned)
    c.insert([13, 14, 15, 16, 17], source([13, 14, 15, 16, 17]))
    assert not c.is_cached(pinned) and c.stats.pinned_evictions == 0
    # A sequence larger than the whole store is refused, and nothing is evicted for it.
    cached = c.bytes_used
    assert c.insert(list(range(20, 29)), source(list(range(20, 29))), pin=True) is None
    assert c.bytes_used == cached and c.stats.pinned_evictions == 0
    # A budget smaller than the pins: pinned entries go too (memory is a hard bound).
    pinned = c.insert([1, 2, 3], source([1, 2, 3]), pin=True)
    assert c.insert([30, 31, 32, 33, 34, 35, 36], source(list(range(30, 37))), pin=True) is not None
    assert not c.is_cached(pinned) and c.stats.pinned_evictions >= 1
    assert c.bytes_used <= 8 * BYTES_PER_TOKEN


def test_zero_budget_caches_nothing():
    c = make(budget=0)
    assert c.insert([1, 2, 3], source([1, 2, 3])) is None
    assert c.bytes_used == 0 and c.match([1, 2, 3]).length == 0


def test_snapshot_keys():
    c = make()
    c.insert([1, 2], source([1, 2]))
    c.match([1, 2, 3])
    s = c.snapshot()
    for k in ("cache_hits", "cache_misses", "cache_hit_tokens", "cache_miss_tokens", "cache_evictions",
              "cache_bytes", "cache_nodes"):
        assert k in s
    assert s["cache_hits"] == 1 and s["cache_miss_tokens"] == 1 and s["cache_bytes"] == 2 * BYTES_PER_TOKEN


def test_release_drops_only_what_the_sequence_alone_used():
    c = make()
    shared = [1, 2, 3, 4]
    a = c.insert(shared + [10, 11], source(shared + [10, 11]), pin=True)
    b = c.insert(shared + [20, 21], source(shared + [20, 21]), pin=True)
    a_longer = c.insert(shared + [10, 11, 12, 13], source(shared + [10, 11, 12, 13]), pin=True)  # a's next turn
    c.unpin(a)  # as the engine does when a conversation's next request pins its longer sequence
    before = c.bytes_used
    assert c.release(a_longer) == 4 * BYTES_PER_TOKEN  # a's own tokens [10..13], not the shared prefix
    assert c.bytes_used == before - 4 * BYTES_PER_TOKEN
    assert c.match(shared + [20, 21]).length == 6  # b is untouched
    assert c.match(shared + [10]).length == 4  # the shared prefix stays
    # b, the last user of the prefix, releases it all; a pinned node would have stopped it.
    assert c.release(b) == 6 * BYTES_PER_TOKEN and c.bytes_used == 0
    assert c.release(None) == 0


def test_release_keeps_a_node_another_pin_holds():
    c = make()
    node = c.insert([1, 2, 3], source([1, 2, 3]), pin=True)
    c.pin(node)  # two holders
    assert c.release(node) == 0 and c.match([1, 2, 3]).length == 3


def test_nodes_hold_indices_into_one_store_and_a_split_copies_nothing():
    c = make()
    a = [1, 2, 3, 4, 5, 6]
    na = c.insert(a, source(a))
    data = c.store.data
    before = na.run.indices.clone()
    assert na.run.start == 0  # a fresh store hands out consecutive indices: reads are views
    c.insert([1, 2, 3, 7], source([1, 2, 3, 7]))
    upper = na.parent
    assert torch.equal(torch.cat([upper.run.indices, na.run.indices]), before)  # the same store positions
    assert (upper.run.start, na.run.start) == (0, 3)
    assert c.store.data is data and c.store.free_tokens == c.store.capacity - 7


def test_leaves_are_tracked_as_the_tree_changes():
    c = make(budget=12 * BYTES_PER_TOKEN)
    c.insert([1, 2, 3, 4], source([1, 2, 3, 4]))
    c.insert([1, 2, 5, 6], source([1, 2, 5, 6]))  # split: [1,2] -> {[3,4], [5,6]}
    assert {n.key for n in c._leaves} == {(3, 4), (5, 6)}
    c.insert([9, 9], source([9, 9]))
    c.evict(4 * BYTES_PER_TOKEN)  # the two oldest leaves: [3,4] then [5,6]; then [1,2] is a leaf
    assert {n.key for n in c._leaves} == {(1, 2), (9, 9)}
    assert c.snapshot()["cache_evictable_leaves"] == 2
    # Evicted indices are handed out again, and the KV read back is the new sequence's.
    c.insert([7, 7, 7, 7, 7, 7, 7, 7], source([7] * 8))
    m = c.match([7] * 8)
    assert m.length == 8 and torch.equal(gathered(c, m), kv_of([7] * 8))


def test_scattered_indices_are_gathered():
    """Indices freed out of order come back scattered: the reads and writes gather and scatter."""
    c = make(budget=6 * BYTES_PER_TOKEN)
    c.insert([1, 2], source([1, 2]))
    c.insert([3, 4], source([3, 4]))
    c.insert([5, 6], source([5, 6]))
    c.match([3, 4])  # [1, 2] then [5, 6] are the oldest
    c.insert([7, 8, 9, 10], source([7, 8, 9, 10]))  # evicts them: indices 0, 1 then 4, 5
    node = c.match([7, 8, 9, 10]).parts[0][0]
    assert node.run.start == -1 and node.run.indices.tolist() == [4, 5, 0, 1]
    m = c.match([7, 8, 9, 10])
    assert torch.equal(gathered(c, m), kv_of([7, 8, 9, 10]))
    assert torch.equal(gathered(c, c.match([3, 4])), kv_of([3, 4]))
