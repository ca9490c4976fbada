"""One live vector index per collection, derived from SQL.

Opening a collection loads its newest valid snapshot generation (or builds from SQL rows when
there is none, or none that verifies) and catches up from the change log: rows with
seq > watermark, in order. Searches call `catch_up` first, which costs one indexed query when
nothing changed, so a chunk is searchable as soon as its ingest transaction commits, in any
process. Rebuilds run in the background and swap in atomically: a search holds a reference to
one whole index, never a half-built one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rag.db import Database
from rag.index import build_index
from rag.index.base import Allowed, VectorIndex, Vectors
from rag.index.live import IndexState, Live, SearchOutcome
from rag.index.maintenance import Maintainer
from rag.index.snapshot import Manifest, SnapshotStore
from rag.index.sync import Spec, SqlSource
from rag.knobs import Knobs

log = logging.getLogger(__name__)

__all__ = ["IndexManager", "IndexState", "SearchOutcome"]


class IndexManager:
    def __init__(
        self,
        db: Database,
        data_dir: Path,
        embedding_model_id: str,
        dim: int,
        *,
        catch_up_wait_s: float = 1.0,
        catch_up_batch: int = 5000,
        snapshot_every: int = 10_000,
        keep_generations: int = 2,
    ) -> None:
        self.db = db
        self.data_dir = Path(data_dir)
        self.embedding_model_id = embedding_model_id
        self.dim = dim
        self.catch_up_wait_s = catch_up_wait_s
        self.snapshot_every = snapshot_every
        self.keep_generations = keep_generations
        self.source = SqlSource(db, embedding_model_id, dim, catch_up_batch)
        self._lives: dict[str, Live] = {}
        self._open_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._builds: dict[str, Future[IndexState]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index-build")
        self._maintainer: Maintainer | None = None

    @property
    def catch_up_batch(self) -> int:
        return self.source.catch_up_batch

    @catch_up_batch.setter
    def catch_up_batch(self, n: int) -> None:
        self.source.catch_up_batch = n

    # ------------------------------------------------------------------------ public API

    def get(self, collection_id: str) -> VectorIndex:
        """The live index, opened (and caught up) on first use."""
        return self._live(collection_id).index

    def state(self, collection_id: str) -> IndexState:
        return self._live(collection_id).state()

    def search(
        self,
        collection_id: str,
        queries: Vectors,
        knobs: Knobs | None = None,
        allowed_ids: Allowed | None = None,
    ) -> SearchOutcome:
        live = self._live(collection_id)
        self.catch_up(collection_id, wait_s=self.catch_up_wait_s)
        index = live.index  # one whole index for this search, even if a rebuild swaps now
        hits = index.search(queries, knobs or Knobs(), allowed_ids)
        return SearchOutcome(hits, live.state())

    def catch_up(self, collection_id: str, *, wait_s: float | None = None) -> int:
        """Apply change-log rows past the watermark; returns how many were applied.

        With `wait_s`, gives up (and marks the index stale) if another thread is applying
        changes for longer than that; the caller then searches what is there."""
        live = self._live(collection_id)
        if not live.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            live.stale = True
            return 0
        try:
            applied = self.source.apply_changes(collection_id, live.index, live.watermark)
        except Exception:
            live.stale = True
            log.exception("index catch-up failed for collection %s", collection_id)
            if wait_s is None:
                raise
            return 0
        else:
            count, watermark = applied
            live.watermark = watermark
            live.changes_since_snapshot += count
            live.stale = False
            return count
        finally:
            live.lock.release()

    def snapshot(self, collection_id: str) -> Manifest:
        """Write the live index as a new generation (after catching up)."""
        live = self._live(collection_id)
        with live.lock:
            count, live.watermark = self.source.apply_changes(
                collection_id, live.index, live.watermark
            )
            manifest = self._store(collection_id).write(
                live.index, embedding_model=self.embedding_model_id, watermark=live.watermark
            )
            live.generation = manifest.generation
            live.changes_since_snapshot = 0
        return manifest

    def rebuild(
        self,
        collection_id: str,
        kind: str | None = None,
        params: dict[str, Any] | None = None,
        *,
        snapshot: bool = True,
    ) -> Future[IndexState]:
        """Build a fresh index from SQL in the background, then swap it in atomically.

        `kind=None` uses the collection's configured kind (or the size-based default). The
        caller records a new kind on the collection row if it should outlive this index."""
        live = self._live(collection_id)
        if kind is not None:
            build_index(kind, self.dim, params)  # fail now, not in the background
        with self._lock:
            running = self._builds.get(collection_id)
            if running is not None and not running.done():
                return running
            live.building = True
            future = self._executor.submit(
                self._rebuild, collection_id, live, kind, params, snapshot
            )
            self._builds[collection_id] = future
        return future

    def open_collections(self) -> list[str]:
        """Collections whose index is loaded in this process."""
        with self._lock:
            return list(self._lives)

    def lives(self) -> Iterable[tuple[str, Live]]:
        with self._lock:
            return list(self._lives.items())

    def forget(self, collection_id: str) -> None:
        """Drop the in-memory index (a deleted collection); snapshots stay until pruned."""
        with self._lock:
            self._lives.pop(collection_id, None)

    def start(self, interval_s: float = 0.5) -> None:
        """Maintain every open collection in the background (rag.index.maintenance)."""
        if self._maintainer is not None:
            return
        self._maintainer = Maintainer(self, self.source, interval_s)
        self._maintainer.start()

    def close(self) -> None:
        if self._maintainer is not None:
            self._maintainer.close()
            self._maintainer = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    # -------------------------------------------------------------------------- opening

    def _store(self, collection_id: str) -> SnapshotStore:
        return SnapshotStore(self.data_dir, collection_id, keep=self.keep_generations)

    def _live(self, collection_id: str) -> Live:
        live = self._lives.get(collection_id)
        if live is not None:
            return live
        with self._lock:
            open_lock = self._open_locks.setdefault(collection_id, threading.Lock())
        with open_lock:  # one opener per collection; others wait for its result
            live = self._lives.get(collection_id)
            if live is None:
                live = self._open(collection_id)
                with self._lock:
                    self._lives[collection_id] = live
        return live

    def _open(self, collection_id: str) -> Live:
        spec = self.source.spec(collection_id)
        store = self._store(collection_id)
        loaded = store.load_latest(embedding_model=self.embedding_model_id, dim=self.dim)
        if loaded is not None:
            live = Live(
                collection_id,
                loaded.index,
                loaded.manifest.watermark,
                auto=spec.auto,
                generation=loaded.manifest.generation,
            )
            log.info(
                "index %s: gen %d (%s, %d vectors, watermark %d)",
                collection_id,
                loaded.manifest.generation,
                loaded.index.kind,
                len(loaded.index),
                loaded.manifest.watermark,
            )
        else:
            if store.generations():
                log.warning("index %s: no snapshot usable; rebuilding from SQL", collection_id)
            index, watermark = self.source.build(collection_id, spec.kind, spec.params)
            # No generation on disk yet: the background loop writes one.
            live = Live(collection_id, index, watermark, auto=spec.auto)
            live.changes_since_snapshot = max(len(index), 1)
        with live.lock:
            count, live.watermark = self.source.apply_changes(
                collection_id, live.index, live.watermark
            )
            live.changes_since_snapshot += count
        return live

    # ------------------------------------------------------------------------ rebuilding

    def _rebuild(
        self,
        collection_id: str,
        live: Live,
        kind: str | None,
        params: dict[str, Any] | None,
        snapshot: bool,
    ) -> IndexState:
        try:
            spec = (
                self.source.spec(collection_id)
                if kind is None
                else Spec(kind, dict(params or {}), False)
            )
            index, watermark = self.source.build(collection_id, spec.kind, spec.params)
            # Catch the new index up outside the lock, then the last few rows inside it.
            _, watermark = self.source.apply_changes(collection_id, index, watermark)
            with live.lock:
                _, watermark = self.source.apply_changes(collection_id, index, watermark)
                live.index, live.watermark, live.auto = index, watermark, spec.auto
                live.generation = None
                live.changes_since_snapshot = max(len(index), 1)
                live.stale = False
            log.info("index %s swapped: %s, %d vectors", collection_id, spec.kind, len(index))
        except Exception:
            log.exception("index rebuild failed for collection %s", collection_id)
            raise
        finally:
            live.building = False
        if snapshot:
            self.snapshot(collection_id)
        return live.state()
