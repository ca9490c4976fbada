"""Paged KV cache bookkeeping: fixed-size blocks, block tables, refcounts and a prefix cache.

A full block's identity is the hash chain of its tokens (hash of the parent block's hash and
its own token ids), so equal prefixes map to equal blocks and are computed once. Blocks nobody
references stay cached until they are needed: they are evicted least recently used first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rag.engine.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()  # kept for cached blocks to rule out hash collisions
    chunk_ids: frozenset[int] = frozenset()  # chunks whose text a cached block holds


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


def approx_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """The identity of a block whose KV a blend computed (rag.engine.passages): a chain of
    its own, so that only blend prompts ever find it."""
    return hash(("blend", parent, token_ids))


def salt_root(salt: str | None) -> int | None:
    """The parent of a sequence's first block: its salt's, so that equal prompts of different
    salts (tenants) hash to different blocks."""
    return None if salt is None else hash(("salt", salt))


class BlockManager:
    """Allocates KV blocks to sequences. "No room" is a return value, never an exception."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced blocks: plain ones first, then cached ones in LRU order.
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._hash_to_block: dict[int, int] = {}
        # Per sequence: hashes of its full blocks so far (the chain), by seq_no.
        self._seq_hashes: dict[int, list[int]] = {}
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # prompt tokens found

    # ----- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_to_block)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ----- prefix cache
    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """Cached blocks holding a prefix of seq's tokens, and how many tokens they cover.

        At least the last token is left to compute: its logits give the next token.
        """
        if not self.enable_prefix_caching:
            return [], 0
        hits = self._walk(seq, 0, salt_root(seq.cache_salt), chain_hash)
        return hits, len(hits) * self.block_size

    def get_blend_blocks(self, seq: Sequence, hits: list[int]) -> list[int]:
        """Cached blocks of a blend's approximate KV that continue the exact prefix `hits`
        (an earlier blend prompt with the same tokens so far): their KV is what this prompt's
        own blend would compute, without computing it."""
        if not self.enable_prefix_caching:
            return []
        parent = self.blocks[hits[-1]].block_hash if hits else salt_root(seq.cache_salt)
        return self._walk(seq, len(hits), parent, approx_hash)

    def _walk(
        self,
        seq: Sequence,
        start: int,
        parent: int | None,
        block_hash: Callable[[int | None, tuple[int, ...]], int],
    ) -> list[int]:
        """Cached blocks of seq's full blocks from block `start` on, chained from `parent`,
        up to the first miss; at least the last token is left to compute (its logits give
        the next token)."""
        bs = self.block_size
        found: list[int] = []
        for i in range(start, (seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(parent, tokens)
            block_id = self._hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            found.append(block_id)
            parent = h
        return found

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count an admitted sequence's lookup in the hit rate."""
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full of computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._seq_hashes.setdefault(seq.seq_no, [])
        computed = seq.num_computed_tokens
        if seq.cache_until is not None:  # a deleted passage's text: cached no more
            computed = min(computed, seq.cache_until)
        num_full = min(computed // bs, len(seq.block_table))
        for i in range(len(hashes), num_full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            parent = hashes[-1] if hashes else salt_root(seq.cache_salt)
            # Reused passages' KV is not exact: from there on the blocks are a blend's.
            approximate = seq.exact_until is not None and (i + 1) * bs > seq.exact_until
            h = approx_hash(parent, tokens) if approximate else chain_hash(parent, tokens)
            hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            chunks = _chunks_in(seq, i * bs, (i + 1) * bs)
            if block.block_hash is not None:
                # A prefix hit: already cached. Equal text may quote another chunk too; a
                # delete of either drops it.
                block.chunk_ids |= chunks
                continue
            if h in self._hash_to_block:
                continue  # computed twice concurrently; keep the first copy
            block.block_hash = h
            block.token_ids = tokens
            block.chunk_ids = chunks
            self._hash_to_block[h] = block.block_id

    # ----- allocation
    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Make seq's block table cover its computed tokens plus num_new_tokens.

        computed_blocks (prefix hits, only when seq has no blocks yet) are shared, not copied.
        Returns the new block ids, or None (and changes nothing) when there is no room.
        """
        computed_blocks = computed_blocks or []
        if computed_blocks and seq.block_table:
            raise ValueError("prefix hits are only for a sequence without blocks")
        num_computed = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        need = self.blocks_needed(num_computed + num_new_tokens)
        have = len(seq.block_table) + len(computed_blocks)
        num_new_blocks = max(0, need - have)
        # Hits that sit in the evictable pool stop being free once referenced.
        hits_from_free = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks + hits_from_free > self.num_free_blocks:
            return None
        for b in computed_blocks:
            self._touch(b)
        seq.block_table.extend(computed_blocks)
        new_ids = [self._take_free_block() for _ in range(num_new_blocks)]
        seq.block_table.extend(new_ids)
        return new_ids

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; tail blocks go to the LRU end first so they are evicted first."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, "block freed twice"
            if block.ref_count == 0:
                if block.block_hash is not None:
                    self._evictable[block_id] = None
                else:
                    self._free_plain.append(block_id)
        seq.block_table.clear()
        self._seq_hashes.pop(seq.seq_no, None)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (rejected draft tokens'
        slots). Those blocks hold no full computed block, so none of them is cached."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0 and block.block_hash is None, "trimmed a shared block"
            if block.ref_count == 0:
                self._free_plain.append(block_id)

    def drop_chunks(self, chunk_ids: set[int]) -> int:
        """Take the cached blocks that hold text of these chunks (deleted documents) out of
        the prefix cache: unreferenced ones are wiped for reuse, ones still in use stop being
        cached and are wiped when freed. Returns how many."""
        gone = [b for b in self._hash_to_block.values() if self.blocks[b].chunk_ids & chunk_ids]
        for block_id in gone:
            self._uncache(block_id)
            if self.blocks[block_id].ref_count == 0:
                self._evictable.pop(block_id, None)
                self._free_plain.append(block_id)
        return len(gone)

    def reset_prefix_cache(self) -> None:
        for block_id in list(self._evictable):
            self._uncache(block_id)
            self._free_plain.append(block_id)
        self._evictable.clear()

    # ----- internals
    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._evictable.pop(block_id, None)
        block.ref_count += 1

    def _take_free_block(self) -> int:
        if self._free_plain:
            block_id = self._free_plain.pop()
        else:
            block_id, _ = self._evictable.popitem(last=False)  # least recently used
            self._uncache(block_id)
        self.blocks[block_id].ref_count = 1
        return block_id

    def _uncache(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None:
            self._hash_to_block.pop(block.block_hash, None)
        block.block_hash = None
        block.token_ids = ()
        block.chunk_ids = frozenset()


def _chunks_in(seq: Sequence, start: int, end: int) -> frozenset[int]:
    """The chunks whose segments overlap tokens [start, end) of seq."""
    return frozenset(
        s.chunk_id
        for s in seq.segments
        if s.chunk_id is not None and s.start < end and s.end > start
    )
