"""The two ways of keeping a collection's index in step with SQL, behind one protocol.

- local (rag.index.local): the index lives in this process's memory. Opening loads the
  newest snapshot generation on disk that verifies (or builds from SQL rows) and catches up
  from the change log; deletes are erased in memory and from the snapshots; a mismatch with
  SQL is patched in place.
- shared (rag.index.milvus.shared): the index lives in an engine every replica shares
  (Milvus). One writer at a time replays the change log into it; a rebuild fills a new engine
  collection and swaps its name in SQL, so every replica follows; there are no snapshots, and
  a mismatch with SQL is mended by a rebuild.

The registry (rag.index.manager) holds one `Live` per open collection, takes its lock where a
search must not wait, and hands every other step to the keeper of the index's kind (the
index's `shared` trait says which).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from rag.index.live import Live
from rag.index.snapshot import Manifest
from rag.index.sync import Spec
from rag.index.verify import Check


class Keeper(Protocol):
    def open(self, collection_id: str, spec: Spec) -> Live:
        """The collection's index of `spec`, loaded or built, and caught up."""
        ...

    def catch_up(self, live: Live, wait_s: float | None) -> int:
        """Apply the change log past `live.watermark` and move it; returns the rows applied
        here. The caller holds live.lock; `wait_s` bounds a wait on another writer."""
        ...

    def snapshot(self, live: Live) -> Manifest | None:
        """Write the index (caught up, removed vectors erased) as a new generation; None
        from a keeper whose indexes have no snapshots."""
        ...

    def repair(self, live: Live) -> Check | None:
        """Patch the index to hold exactly what SQL holds; returns what was found before.
        None when it cannot be patched in place: the registry rebuilds it."""
        ...

    def count_check(self, live: Live) -> Check | None:
        """The index's count against SQL, without the lock; None when that says nothing
        now (it moved meanwhile, or its engine's count lags its writes)."""
        ...

    def erase(self, live: Live) -> None:
        """Leave no copy of a removed chunk's vector: in memory, on disk, in the engine."""
        ...

    def rebuild(self, live: Live, spec: Spec, *, asked: bool) -> None:
        """Build an index of `spec` from SQL and swap it into `live`. `asked`: a rebuild was
        requested (not the maintenance loop's, which may adopt one built elsewhere)."""
        ...

    def drop(self, collection_id: str) -> None:
        """Delete what it keeps of a deleted collection outside this process's memory."""
        ...

    def sweep(self, open_ids: Collection[str]) -> int:
        """Drop what it keeps of collections deleted anywhere, and tidy what it keeps of live
        ones not open here; returns how many collections it dropped."""
        ...

    def close(self) -> None: ...
