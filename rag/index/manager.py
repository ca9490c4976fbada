"""The registry of live indexes: one per open collection, derived from SQL.

Opening a collection asks the keeper of its kind (rag.index.keeper) for its index: the local
keeper loads a snapshot or builds from SQL rows, the shared keeper binds to the engine
collection SQL names. Searches call `catch_up` first, which costs one indexed query when
nothing changed, so a chunk is searchable as soon as its ingest transaction commits, in any
process. Rebuilds run in the background and swap in atomically: a search holds a reference to
one whole index, never a half-built one.

Deletes: catch-up removes a chunk at once; `purge` (every `erase_interval_s`, from the
maintenance thread) then has each keeper erase it for good, and a deleted collection's index
goes from memory and from wherever its keeper kept it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rag.config import MilvusSettings
from rag.db import Database, changelog, collections
from rag.errors import Invalid
from rag.index import build_index, index_class
from rag.index import verify as against_sql
from rag.index.base import Allowed, VectorIndex, Vectors
from rag.index.filters import Where
from rag.index.keeper import Keeper
from rag.index.live import IndexState, Live, SearchOutcome
from rag.index.local import LocalKeeper
from rag.index.maintenance import Maintainer
from rag.index.snapshot import Manifest
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
        erase_interval_s: float = 60.0,
        milvus: MilvusSettings | None = None,
    ) -> None:
        self.db = db
        self.data_dir = Path(data_dir)
        self.embedding_model_id = embedding_model_id
        self.dim = dim
        self.catch_up_wait_s = catch_up_wait_s
        self.snapshot_every = snapshot_every
        self.erase_interval_s = erase_interval_s
        self.source = SqlSource(db, embedding_model_id, dim, catch_up_batch)
        self.local = LocalKeeper(db, self.source, self.data_dir, keep_generations=keep_generations)
        self.milvus = milvus
        self._shared: Keeper | None = None  # made on first use: it connects to Milvus
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
        where: Where | None = None,
    ) -> SearchOutcome:
        """`where` is evaluated by an index that filters inside its own engine
        (`filters_inside`); the caller applies it to what comes back (rag.index.filters)."""
        live = self._live(collection_id)
        self.catch_up(collection_id, wait_s=self.catch_up_wait_s)
        index = live.index  # one whole index for this search, even if a rebuild swaps now
        hits = index.search(queries, knobs or Knobs(), allowed_ids, where)
        return SearchOutcome(hits, live.state())

    def filters_inside(self, collection_id: str) -> bool:
        """True when the collection's index evaluates metadata filters itself (Milvus)."""
        return self._live(collection_id).index.filters_inside

    def catch_up(self, collection_id: str, *, wait_s: float | None = None) -> int:
        """Apply change-log rows past the watermark; returns how many were applied.

        With `wait_s`, gives up (and marks the index stale) if another thread is applying
        changes for longer than that; the caller then searches what is there."""
        live = self._live(collection_id)
        return live.catch_up(self._keeper(live.index.shared).catch_up, wait_s)

    def snapshot(self, collection_id: str) -> Manifest:
        """Write the live index as a new generation (rag.index.local)."""
        live = self._live(collection_id)
        manifest = self._keeper(live.index.shared).snapshot(live)
        if manifest is None:
            raise Invalid(f"a {live.index.kind} index lives outside this process: no snapshots")
        return manifest

    # ------------------------------------------------------------------ checking with SQL

    def check(self, collection_id: str) -> against_sql.Check:
        """Compare the index with SQL, once caught up: counts and ids (rag.index.verify)."""
        live = self._live(collection_id)
        self.catch_up(collection_id)
        with live.lock:
            found = against_sql.check(self.db, self.source, collection_id, live)
            live.mismatch = found.mismatch
        return found

    def repair(self, collection_id: str) -> against_sql.Check:
        """Make the index hold what SQL holds; returns what the check found before. Its
        keeper patches it in place, or else it is rebuilt from SQL."""
        live = self._live(collection_id)
        found = self._keeper(live.index.shared).repair(live)
        if found is not None:
            return found
        found = self.check(collection_id)
        if not found.ok:
            self.rebuild(collection_id, live.index.kind, live.index.params).result()
            self.check(collection_id)
        return found

    def check_counts(self) -> None:
        """Every open index's count against SQL (no lock held: searches never wait); one
        that differs is checked id by id and repaired."""
        for collection_id, live in self.lives():
            found = self._keeper(live.index.shared).count_check(live)
            if found is None:
                continue
            live.mismatch = found.mismatch
            if not found.ok:
                self.repair(collection_id)

    def check_reused(self) -> None:
        """An install whose SQLite handed purged chunk ids out again (before migration 0008):
        the indexes of the collections concerned are checked against SQL and repaired."""
        with self.db.read() as session:
            concerned = changelog.collections_with_reused_ids(session)
            concerned = sorted(collections.live_among(session, concerned))
        for collection_id in concerned:
            log.info("index %s: chunk ids were reused; checking it against SQL", collection_id)
            self.repair(collection_id)

    # --------------------------------------------------------------------------- purging

    def purge(self) -> None:
        """Erase what deletes removed: a deleted collection's open index is dropped, every
        other open index erases its removed vectors, and each keeper sweeps what it keeps
        of collections not open here."""
        open_ids = self.open_collections()
        with self.db.read() as session:
            live_ids = collections.live_among(session, open_ids)
        for collection_id in open_ids:
            if collection_id not in live_ids:
                self.drop(collection_id)
        for collection_id, _live in self.lives():
            self.erase(collection_id)
        still_open = set(self.open_collections())
        for keeper in self._keepers():
            keeper.sweep(still_open)

    def erase(self, collection_id: str) -> None:
        """Erase the vectors of removed chunks from the open index, wherever it keeps them."""
        live = self._lives.get(collection_id)
        if live is not None:
            self._keeper(live.index.shared).erase(live)

    def drop(self, collection_id: str) -> None:
        """A deleted collection: its index leaves memory, and what its keepers keep goes."""
        if collection_id in self.open_collections():
            log.info("index %s: collection deleted; dropping its index", collection_id)
        self.forget(collection_id)
        for keeper in self._keepers():
            keeper.drop(collection_id)

    def sweep_shared(self) -> int:
        """Drop the Milvus collections of collections deleted elsewhere (another replica's
        delete, a purge): returns how many went."""
        if not self._shared_configured():
            return 0
        return self._keeper(True).sweep(set(self.open_collections()))

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
        """Drop the in-memory index; what its keeper keeps stays (`drop` removes that too)."""
        with self._lock:
            self._lives.pop(collection_id, None)

    def start(self, interval_s: float = 0.5) -> None:
        """Maintain every open collection in the background (rag.index.maintenance)."""
        if self._maintainer is not None:
            return
        self._maintainer = Maintainer(self, self.source, interval_s, self.erase_interval_s)
        self._maintainer.start()

    def close(self) -> None:
        if self._maintainer is not None:
            self._maintainer.close()
            self._maintainer = None
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.local.close()
        if self._shared is not None:
            self._shared.close()

    # -------------------------------------------------------------------------- keepers

    def _keeper(self, shared: bool) -> Keeper:
        """The keeper of an index with this `shared` trait."""
        if not shared:
            return self.local
        if self._shared is None:
            if not self._shared_configured():
                raise Invalid(
                    "index kind 'milvus' needs a Milvus server: set RAG_MILVUS__URI "
                    "(for example http://milvus:19530)"
                )
            from rag.index.milvus import MilvusEngine
            from rag.index.milvus.shared import SharedKeeper

            assert self.milvus is not None
            with self._lock:
                if self._shared is None:
                    self._shared = SharedKeeper(self.db, self.source, MilvusEngine(self.milvus))
        return self._shared

    def _keepers(self) -> list[Keeper]:
        """Every keeper this process may have kept an index with."""
        return [self.local, self._keeper(True)] if self._shared_configured() else [self.local]

    def _shared_configured(self) -> bool:
        return self.milvus is not None and bool(self.milvus.uri)

    # -------------------------------------------------------------------------- opening

    def _live(self, collection_id: str) -> Live:
        live = self._lives.get(collection_id)
        if live is not None:
            return live
        with self._lock:
            open_lock = self._open_locks.setdefault(collection_id, threading.Lock())
        with open_lock:  # one opener per collection; others wait for its result
            live = self._lives.get(collection_id)
            if live is None:
                spec = self.source.spec(collection_id)
                live = self._keeper(index_class(spec.kind).shared).open(collection_id, spec)
                with self._lock:
                    self._lives[collection_id] = live
        return live

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
            keeper = self._keeper(index_class(spec.kind).shared)
            keeper.rebuild(live, spec, asked=kind is not None)
        except Exception:
            log.exception("index rebuild failed for collection %s", collection_id)
            raise
        finally:
            live.building = False
        if snapshot:
            keeper.snapshot(live)  # none where the index lives in its engine
        return live.state()
