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
  everything after them attending to the copy (EPIC's choice; bench/README.md measures it
  against CacheBlend's deviation-based choice and against none); the last `recompute_last`
  passages (nearest the question, which reads them most closely) may be computed whole;
- the rest of the prompt (passage headers, whose numbers change from prompt to prompt, the
  question, the template) is computed as usual, attending to everything before it.

A prompt whose passages are all new is computed exactly (as without this cache), and its
passages are stored. The cache is a tier of its own, bounded in bytes, least recently used
out first; a deleted chunk's entries are dropped (`drop_chunks`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

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
