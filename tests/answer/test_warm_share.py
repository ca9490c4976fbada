"""A warm-up never evicts another tenant's passages and fills at most its share of the cache
(a fake engine whose passage cache counts bytes as the real one does)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from rag.answer import warm
from rag.engine.passages import PassageStats

TOKEN_BYTES = 100


class CacheEngine:
    """Stores each prompt's passage segment as an entry of TOKEN_BYTES a token, least
    recently used evicted first, like rag.engine.passages.PassageKVCache."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, int] = OrderedDict()
        self.evictions = 0
        self.seen_token_bytes = 0

    def metrics(self) -> Any:
        return SimpleNamespace(
            passages=PassageStats(
                evictions=self.evictions, entries=len(self.entries),
                bytes=sum(self.entries.values()), capacity_bytes=self.capacity,
                token_bytes=self.seen_token_bytes,
            )
        )  # fmt: skip

    def put(self, key: str, nbytes: int) -> None:
        while self.entries and sum(self.entries.values()) + nbytes > self.capacity:
            self.entries.popitem(last=False)
            self.evictions += 1
        self.entries[key] = nbytes
        self.seen_token_bytes = TOKEN_BYTES

    def submit(self, prompt: Any, params: Any, **_: Any) -> AsyncIterator[Any]:
        async def run() -> AsyncIterator[Any]:
            for segment in prompt.segments:
                self.put(segment.key, (len(segment.text) // 4 + 1) * TOKEN_BYTES)
            yield None

        return run()


def _services(engine: CacheEngine, share: float) -> Any:
    return SimpleNamespace(engine=engine, settings=SimpleNamespace(ask=SimpleNamespace(
        warm_max_share=share)))  # fmt: skip


def _items(n: int, words: int = 50) -> list[warm.WarmPassage]:
    return [warm.WarmPassage(i, "word " * words, f"f{i}.txt") for i in range(n)]


def test_a_warm_up_leaves_other_tenants_entries_alone() -> None:
    engine = CacheEngine(capacity=100_000)
    for i in range(12):  # another tenant's passages: 78,000 of the 100,000 bytes
        engine.put(f"other:{i}", 6_500)
    others = set(engine.entries)
    done = asyncio.run(warm.warm(_services(engine, 1.0), "attacker", _items(500)))
    assert others <= set(engine.entries) and engine.evictions == 0
    assert 0 < done < 500


def test_a_warm_up_fills_at_most_its_share() -> None:
    engine = CacheEngine(capacity=100_000)
    done = asyncio.run(warm.warm(_services(engine, 0.25), "t", _items(500)))
    assert done > 0 and sum(engine.entries.values()) <= 25_000
