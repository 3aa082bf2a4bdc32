"""Shared prefix KV cache: a token-granular radix tree keyed by token ids, over one token KV store.

Each node holds the *indices* of its edge's tokens in a :class:`~.token_store.TokenKVStore` (one
tensor for all cached KV), as SGLang's radix cache holds indices into its token pool: splitting an
edge slices its index run, eviction hands indices back, and no node owns a tensor of its own. A
lookup returns the longest common prefix between a token sequence and the tree, at token granularity
(a match may end in the middle of an edge: only that part of the node is used). The KV of a token
depends only on the tokens before it, so any prefix of a cached sequence is exact: reuse stops
exactly at the first differing token, which is how a truncated conversation rolls back.

Memory is the store's capacity: when an insert finds too few free tokens, least-recently-used leaves
are evicted first; pinned leaves (conversations that will come back) only when nothing else is left.
The leaves are tracked as the tree changes, so an eviction orders the current leaves and never walks
the tree. Pins never affect correctness, only what stays cached.

The cache is not thread-safe: the engine uses it from its scheduler thread only (``stats`` may be read
from anywhere).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .token_store import TokenKVStore, TokenRun

KVSource = Callable[[int, int], torch.Tensor]
"""``source(start, stop)`` returns the KV of tokens [start, stop) (it is copied into the store)."""


class RadixNode:
    __slots__ = ("key", "run", "children", "parent", "last_access", "pins", "__weakref__")

    def __init__(self, key: tuple[int, ...], run: TokenRun | None, parent: RadixNode | None) -> None:
        self.key = key
        self.run = run  # the edge's tokens in the store; None once evicted
        self.children: dict[int, RadixNode] = {}
        self.parent = parent
        self.last_access = 0
        self.pins = 0

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"RadixNode(len={len(self.key)}, children={len(self.children)}, pins={self.pins})"


@dataclass
class PrefixMatch:
    """The longest cached prefix of a sequence: ``length`` tokens, found in ``parts``.

    ``parts`` is a list of (node, n): the first ``n`` tokens of ``node``'s edge, in sequence order.
    """

    length: int = 0
    parts: list[tuple[RadixNode, int]] = field(default_factory=list)


@dataclass
class CacheStats:
    hits: int = 0            # lookups that reused at least one token
    misses: int = 0          # lookups that reused nothing
    hit_tokens: int = 0      # tokens reused
    miss_tokens: int = 0     # tokens looked up but not found (so computed)
    inserted_tokens: int = 0
    evictions: int = 0       # nodes evicted
    evicted_tokens: int = 0
    pinned_evictions: int = 0  # evictions of a pinned node (budget too small for the pins)


class PrefixCache:
    def __init__(self, store: TokenKVStore) -> None:
        self.store = store
        self.bytes_per_token = store.bytes_per_token
        self.max_bytes = store.capacity * self.bytes_per_token
        self.root = RadixNode((), None, None)
        self.num_nodes = 0
        self.num_tokens = 0
        self.stats = CacheStats()
        self._clock = itertools.count(1)
        self._leaves: set[RadixNode] = set()

    @property
    def bytes_used(self) -> int:
        return self.num_tokens * self.bytes_per_token

    # -- lookup ---------------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], *, max_length: int | None = None, record: bool = True) -> PrefixMatch:
        """Longest cached prefix of ``tokens`` (at most ``max_length`` tokens); touches the nodes (LRU)."""
        limit = len(tokens) if max_length is None else max(0, min(len(tokens), max_length))
        result = PrefixMatch()
        node = self.root
        i = 0
        now = next(self._clock)
        while i < limit:
            child = node.children.get(tokens[i])
            if child is None:
                break
            key = child.key
            n = min(len(key), limit - i)
            c = 0
            while c < n and key[c] == tokens[i + c]:
                c += 1
            if c == 0:  # pragma: no cover - children are keyed by their first token
                break
            result.parts.append((child, c))
            i += c
            if c < len(key):
                break
            node = child
        # Touch the whole path, so a path in use never looks older than its leaves.
        for part, _ in result.parts:
            part.last_access = now
        result.length = i
        if record:
            if i > 0:
                self.stats.hits += 1
            else:
                self.stats.misses += 1
            self.stats.hit_tokens += i
            self.stats.miss_tokens += len(tokens) - i
        return result

    def read(self, match: PrefixMatch) -> list[torch.Tensor]:
        """A match's KV, a piece per node in sequence order (views where a node's run is consecutive:
        copy them before the cache changes)."""
        pieces = []
        for node, n in match.parts:
            assert node.run is not None
            pieces.append(self.store.read(node.run.head(n)))
        return pieces

    # -- insertion ------------------------------------------------------------------------------------
    def _split(self, node: RadixNode, c: int) -> RadixNode:
        """Split ``node``'s edge after ``c`` tokens; returns the new upper node. ``node`` keeps the tail,
        so pins and identities held on it still mean "the sequence ending where it ends"."""
        parent = node.parent
        assert parent is not None and node.run is not None and 0 < c < len(node.key)
        upper = RadixNode(node.key[:c], node.run.head(c), parent)
        node.key = node.key[c:]
        node.run = node.run.tail(c)
        upper.last_access = node.last_access
        parent.children[upper.key[0]] = upper
        upper.children[node.key[0]] = node
        node.parent = upper
        self.num_nodes += 1
        return upper

    def insert(self, tokens: Sequence[int], source: KVSource, *, pin: bool = False) -> RadixNode | None:
        """Cache the KV of ``tokens`` (the part not cached yet is read from ``source`` and copied).

        Returns the node where the sequence ends (pinned once more if ``pin``), or None for an empty
        sequence or when the store cannot hold the new part even after evicting everything else.
        """
        tokens = tuple(int(t) for t in tokens)
        if not tokens:
            return None
        now = next(self._clock)
        node = self.root
        i = 0
        end_node: RadixNode | None = None
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                end_node = self._add_leaf(node, tokens, i, source, now)
                if end_node is None:
                    return None
                break
            key = child.key
            n = min(len(key), len(tokens) - i)
            c = 0
            while c < n and key[c] == tokens[i + c]:
                c += 1
            child.last_access = now
            if c < len(key) and i + c < len(tokens):
                # Diverges inside this edge: split it, then add a new branch below the split point.
                node = self._split(child, c)
                node.last_access = now
                i += c
                continue
            i += c
            node = child
            if i == len(tokens):
                end_node = child  # the sequence ends at or inside this edge: already cached
        if end_node is None:  # pragma: no cover
            return None
        if pin:
            end_node.pins += 1
        return end_node

    def _add_leaf(self, parent: RadixNode, tokens: tuple[int, ...], i: int, source: KVSource,
                  now: int) -> RadixNode | None:
        n = len(tokens) - i
        if n > self.store.capacity:
            return None  # it could never fit: keep what is cached
        if self.store.free_tokens < n:
            self.evict((n - self.store.free_tokens) * self.bytes_per_token, protect=parent)
        run = self.store.allocate(n)
        if run is None:
            return None
        kv = source(i, len(tokens))
        if kv.shape[self.store.token_dim] != n:
            self.store.free(run)
            raise ValueError(f"KV source returned {kv.shape[self.store.token_dim]} tokens, expected {n}")
        self.store.write(run, kv)
        leaf = RadixNode(tokens[i:], run, parent)
        leaf.last_access = now
        parent.children[tokens[i]] = leaf
        self._leaves.discard(parent)
        self._leaves.add(leaf)
        self.num_nodes += 1
        self.num_tokens += n
        self.stats.inserted_tokens += n
        return leaf

    # -- pins -----------------------------------------------------------------------------------------
    def pin(self, node: RadixNode) -> None:
        node.pins += 1

    def unpin(self, node: RadixNode | None) -> None:
        if node is not None and node.pins > 0:
            node.pins -= 1

    def release(self, node: RadixNode | None) -> int:
        """Unpin ``node`` and drop the KV only its owner used: the node, if nothing is cached below it
        and nothing else pins it, and its ancestors that are left the same way, up to the first one
        that other sequences branch from (a shared prefix stays). Returns the bytes freed."""
        self.unpin(node)
        freed = 0
        while (node is not None and node is not self.root and node.parent is not None and not node.children
               and node.pins == 0):
            parent = node.parent
            freed += len(node.key) * self.bytes_per_token
            self._remove_leaf(node)
            node = parent
        return freed

    def is_cached(self, node: RadixNode) -> bool:
        """Whether ``node`` is still in the tree (not evicted)."""
        while node.parent is not None:
            if node.parent.children.get(node.key[0]) is not node:
                return False
            node = node.parent
        return node is self.root

    # -- eviction -------------------------------------------------------------------------------------
    def _remove_leaf(self, leaf: RadixNode) -> None:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.run is not None
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self._leaves.discard(leaf)
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)
        self.store.free(leaf.run)
        leaf.run = None
        self.num_nodes -= 1
        self.num_tokens -= len(leaf.key)
        self.stats.evictions += 1
        self.stats.evicted_tokens += len(leaf.key)
        if leaf.pins:
            self.stats.pinned_evictions += 1

    def evict(self, nbytes: int, *, protect: RadixNode | None = None) -> int:
        """Evict LRU leaves (unpinned first) until ``nbytes`` are freed; returns the bytes freed.
        ``protect`` (the node an insert attaches to) stays, and so its ancestors."""
        freed = 0
        for pinned_pass in (False, True):
            if freed >= nbytes:
                break
            heap = [(leaf.last_access, id(leaf), leaf) for leaf in self._leaves
                    if (leaf.pins > 0) == pinned_pass and leaf is not protect]
            heapq.heapify(heap)
            while heap and freed < nbytes:
                _, _, leaf = heapq.heappop(heap)
                parent = leaf.parent
                freed += len(leaf.key) * self.bytes_per_token
                self._remove_leaf(leaf)
                if (parent is not None and parent in self._leaves and parent is not protect
                        and (parent.pins > 0) == pinned_pass):
                    heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def clear(self) -> None:
        self.evict(self.bytes_used + 1)

    def snapshot(self) -> dict[str, float]:
        s = self.stats
        return {
            "cache_hits": s.hits,
            "cache_misses": s.misses,
            "cache_hit_tokens": s.hit_tokens,
            "cache_miss_tokens": s.miss_tokens,
            "cache_inserted_tokens": s.inserted_tokens,
            "cache_evictions": s.evictions,
            "cache_evicted_tokens": s.evicted_tokens,
            "cache_pinned_evictions": s.pinned_evictions,
            "cache_bytes": self.bytes_used,
            "cache_budget_bytes": self.max_bytes,
            "cache_nodes": self.num_nodes,
            "cache_tokens": self.num_tokens,
            "cache_evictable_leaves": len(self._leaves),
        }
