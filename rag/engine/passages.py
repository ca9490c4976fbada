"""The passage KV cache: each passage's keys and values, computed once and reused in later
prompts at whatever position the passage lands (CacheBlend's idea, kept simple).

In RAG the expensive part of a prompt, its passages, repeats: popular chunks come back question
after question, in other combinations and orders, so the prefix cache (which needs the same
tokens in the same order) rarely hits past the system prompt. Here a passage's KV is stored
under its key (chunk id + hash of the rendered text, salted by tenant) when a prompt first
computes it, and a later prompt with the same passage copies it into its own blocks instead
of computing it:

- keys are rotated from the position they were computed at to the new one (RoPE rotations
  compose, so this is exact up to rounding); values carry no position;
- what independent computation misses (the passage's tokens attending to the other passages
  of this prompt) is repaired by recomputing its first `recompute_first` tokens in place, with
  everything after them attending to the copy (EPIC's choice; bench/ttft.py measures it
  against CacheBlend's deviation-based choice and against none); the last `recompute_last`
  passages (nearest the question, which reads them most closely) may be computed whole;
- the rest of the prompt (passage headers, whose numbers change from prompt to prompt, the
  question, the template) is computed as usual, attending to everything before it.

`ReusePlanner` makes that plan for each prompt the scheduler admits (what to copy, recompute
and store), asking only the cache's index; the runner carries it out on the cache's tensors.

A prompt whose passages are all new is computed exactly (as without this cache), and its
passages are stored. The cache is a tier of its own, bounded in bytes, least recently used
out first; a deleted chunk's entries are dropped (`drop_chunks`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag.engine.sequence import ReusePlan

if TYPE_CHECKING:
    import torch

    from rag.engine.sequence import Sequence

log = logging.getLogger(__name__)


@dataclass
class Entry:
    # [L, 2, n * Hkv, D]: every layer's keys (as rotated for position `start`) and values,
    # token-major like the paged cache's rows, in the cache's storage format.
    kv: torch.Tensor
    start: int
    chunk_id: int | None
    num_kv_heads: int = 1

    @property
    def nbytes(self) -> int:
        return int(self.kv.numel() * self.kv.element_size())

    @property
    def tokens(self) -> int:
        return int(self.kv.shape[2]) // self.num_kv_heads


@dataclass
class PassageStats:
    hits: int = 0  # passages a prompt took from the cache
    misses: int = 0  # passages a prompt computed (and stored)
    evictions: int = 0
    stored: int = 0
    reused_tokens: int = 0  # prompt tokens copied in (rotated) instead of computed
    recomputed_tokens: int = 0  # tokens of reused passages recomputed in place
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0  # 0: no passage cache
    token_bytes: int = 0  # what an entry takes a token (0: none stored yet)


class PassageKVCache:
    """Entries by key, least recently used first; `capacity_bytes` bounds their sum. Entries
    are kept on `device` in `dtype` (bfloat16 halves float32's bytes; copies are turned back
    into the paged cache's format)."""

    def __init__(
        self, capacity_bytes: int, dtype: torch.dtype | None = None, device: Any = "cpu"
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.dtype = dtype
        self.device = device
        self.used_bytes = 0
        self.stats = PassageStats()
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()  # drop_chunks comes from other threads

    def __len__(self) -> int:
        return len(self._entries)

    def tokens_of(self, key: str) -> int | None:
        """The entry's length, or None (a planning question: touches nothing)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.tokens

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: Entry) -> None:
        if entry.nbytes > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used_bytes -= old.nbytes
            while self._entries and self.used_bytes + entry.nbytes > self.capacity_bytes:
                _, gone = self._entries.popitem(last=False)
                self.used_bytes -= gone.nbytes
                self.stats.evictions += 1
            self._entries[key] = entry
            self.used_bytes += entry.nbytes
            self.stats.stored += 1
            self.stats.token_bytes = entry.nbytes // max(1, entry.tokens)

    def drop_chunks(self, chunk_ids: set[int]) -> int:
        """Forget every entry of these chunks (deleted documents); returns how many."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.chunk_id in chunk_ids]
            for key in gone:
                self.used_bytes -= self._entries.pop(key).nbytes
        if gone:
            log.info("passage cache: dropped %d entries of deleted chunks", len(gone))
        return len(gone)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used_bytes = 0


@dataclass(frozen=True)
class ReuseConfig:
    # "first": the first `recompute_first` tokens of each reused passage are recomputed in
    # place; "deviation": every token goes through the first layer, then the
    # `recompute_ratio` of each reused passage that deviate most.
    recompute_first: int = 8
    recompute: str = "first"
    recompute_ratio: float = 0.15
    # The last passages of a prompt (those nearest the question, which it reads most closely)
    # computed whole in place even when cached: their cached KV misses the most.
    recompute_last: int = 0


# The cache's index: a passage key -> the tokens cached under it, or None.
PassageLookup = Callable[[str], "int | None"]


class ReusePlanner:
    """Plans how "blend" prompts use the passage cache: which passages are copied in, which
    tokens around them are computed, which passages are stored once computed. It asks only
    the cache's index (`lookup`), never its tensors: it runs inside the scheduler, and its
    tests build the index by hand. `config` may be swapped between steps (the bench sweeps
    it)."""

    def __init__(self, config: ReuseConfig, lookup: PassageLookup, block_size: int) -> None:
        self.config = config
        self.lookup = lookup
        self.block_size = block_size
        self.num_hits = 0  # passages copied from the passage cache
        self.num_misses = 0  # passages computed (and stored)
        self.num_recomputed_tokens = 0  # tokens of reused passages recomputed in place

    def trim_hit(self, seq: Sequence, hits: list[int], computed: int) -> tuple[list[int], int]:
        """A prefix hit that ends a few tokens into a cached passage (segments of different
        passages begin with the same few tokens) stops at the block before it: recomputing
        those tokens is cheaper than computing the passage that copying would have skipped.
        A hit that covers more of it than a copy would recompute is kept (exact)."""
        if seq.kv_reuse != "blend" or not hits:
            return hits, computed
        for span in seq.segments:
            n = span.end - span.start
            if not span.start < computed < span.end or self.lookup(span.key) != n:
                continue
            if computed - span.start >= self.config.recompute_first:
                return hits, computed
            keep = span.start // self.block_size
            return hits[:keep], keep * self.block_size
        return hits, computed

    def plan(self, seq: Sequence, computed: int) -> ReusePlan | None:
        """Which of a prompt's passages come from the passage cache, which are stored there
        once computed, for a prompt whose first `computed` tokens are cached already. None:
        nothing to reuse or store (the prompt is computed as usual)."""
        if seq.kv_reuse != "blend" or not seq.segments:
            return None
        first = self.config.recompute_first
        by_deviation = self.config.recompute == "deviation"
        ratio = self.config.recompute_ratio
        positions: list[int] = []
        candidates: list[bool] = []
        copies: list[tuple[str, int, int]] = []
        stores: list[tuple[str, int, int, int | None]] = []
        cursor = computed
        reused = recomputed = 0
        # The prompt's passages in order, a cut one left out.
        spans = [s for s in sorted(seq.segments, key=lambda s: s.start)
                 if s.start < s.end <= seq.num_tokens]  # fmt: skip
        in_place = len(spans) - self.config.recompute_last
        for i, span in enumerate(spans):
            n = span.end - span.start
            held = self.lookup(span.key) == n
            if not held:
                # Stored once computed (a part inside the prefix hit is there already).
                stores.append((span.key, span.start, n, span.chunk_id))
            elif i >= in_place:
                continue  # computed in place with what follows it (its entry stays as is)
            elif span.start >= computed:  # else: inside the prefix hit (exact or a blend's)
                keep = round(ratio * n) if by_deviation else min(first, n)
                positions += range(cursor, span.start if by_deviation else span.start + keep)
                candidates += [False] * (len(positions) - len(candidates))
                if by_deviation:  # all through the first layer, `keep` of them past it
                    positions += range(span.start, span.end)
                    candidates += [True] * n
                copies.append((span.key, span.start, n))
                reused += n - keep
                recomputed += keep
                cursor = span.end
        if not copies and not stores:
            return None
        positions += range(cursor, seq.num_tokens)
        candidates += [False] * (len(positions) - len(candidates))
        if seq.num_preemptions == 0:
            seq.num_reused_tokens, seq.num_recomputed_tokens = reused, recomputed
            self.num_hits += len(copies)
            self.num_misses += len(stores)
            self.num_recomputed_tokens += recomputed
        if copies:
            # Blocks past the first copy hold approximate KV: never shared as an exact prefix.
            at = copies[0][1]
            seq.exact_until = at if seq.exact_until is None else min(seq.exact_until, at)
        return ReusePlan(
            positions, tuple(copies), tuple(stores), seq.num_tokens,
            candidates=candidates if by_deviation and copies else None, ratio=ratio,
        )  # fmt: skip
