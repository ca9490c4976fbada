"""One live vector index per collection, derived from SQL.

Opening a collection loads its newest valid snapshot generation (or builds from SQL rows when
there is none, or none that verifies) and catches up from the change log: rows with
seq > watermark, in order. Searches call `catch_up` first, which costs one indexed query when
nothing changed, so a chunk is searchable as soon as its ingest transaction commits, in any
process. Rebuilds run in the background and swap in atomically: a search holds a reference to
one whole index, never a half-built one.

A kind whose index lives outside the process (`milvus`: its class says `shared`) has no
snapshots: opening it binds to the Milvus collection SQL names, catching up goes through the
one writer of rag.index.milvus.shared, and a rebuild fills a new Milvus collection and swaps
its name in SQL, so every replica follows.

Deletes: catch-up tombstones a removed chunk at once; `purge` (every `erase_interval_s`, from
the maintenance thread) then erases it for good: from the index's memory (`erase`), from the
snapshots on disk (a generation older than a removal is rewritten or deleted), and a deleted
collection's index and snapshots are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.config import MilvusSettings
from rag.db import Database, changelog, collections
from rag.errors import Invalid
from rag.index import build_index, erase, index_class
from rag.index import verify as against_sql
from rag.index.base import Allowed, VectorIndex, Vectors
from rag.index.live import IndexState, Live, SearchOutcome
from rag.index.maintenance import Maintainer
from rag.index.snapshot import Manifest, SnapshotStore, collections_on_disk
from rag.index.sync import Spec, SqlSource
from rag.knobs import Knobs

if TYPE_CHECKING:
    from rag.index.milvus.filters import Where
    from rag.index.milvus.shared import SharedIndexes

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
        self.keep_generations = keep_generations
        self.erase_interval_s = erase_interval_s
        self.source = SqlSource(db, embedding_model_id, dim, catch_up_batch)
        self._lives: dict[str, Live] = {}
        self._open_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._builds: dict[str, Future[IndexState]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index-build")
        self._maintainer: Maintainer | None = None
        self.milvus = milvus
        self._shared: SharedIndexes | None = None

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
        """`where` goes to an index that filters inside its own engine (`filters_inside`);
        the caller applies it to what comes back (see rag.index.milvus.filters)."""
        live = self._live(collection_id)
        self.catch_up(collection_id, wait_s=self.catch_up_wait_s)
        index = live.index  # one whole index for this search, even if a rebuild swaps now
        if where is not None and getattr(index, "filters_inside", False):
            hits = index.search(queries, knobs or Knobs(), allowed_ids, where=where)  # type: ignore[call-arg]
        else:
            hits = index.search(queries, knobs or Knobs(), allowed_ids)
        return SearchOutcome(hits, live.state())

    def filters_inside(self, collection_id: str) -> bool:
        """True when the collection's index evaluates metadata filters itself (Milvus)."""
        return bool(getattr(self._live(collection_id).index, "filters_inside", False))

    def catch_up(self, collection_id: str, *, wait_s: float | None = None) -> int:
        """Apply change-log rows past the watermark; returns how many were applied.

        With `wait_s`, gives up (and marks the index stale) if another thread is applying
        changes for longer than that; the caller then searches what is there."""
        live = self._live(collection_id)
        if not live.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            live.stale = True
            return 0
        try:
            if _shared(live.index):
                count, mark = self._shared_indexes().catch_up(
                    collection_id,
                    live.index,  # type: ignore[arg-type]
                    live.watermark,
                    wait_s=30.0 if wait_s is None else wait_s,
                )
                live.watermark, live.stale = mark, False
                live.caught_up_at = time.monotonic()
                return count
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
            live.caught_up_at = time.monotonic()
            return count
        finally:
            live.lock.release()

    def snapshot(self, collection_id: str) -> Manifest:
        """Write the live index as a new generation (after catching up and erasing what was
        removed: no generation holds a removed vector), then delete the generations older
        than the collection's last removal."""
        live = self._live(collection_id)
        if not getattr(live.index, "snapshots", True):
            raise Invalid(f"a {live.index.kind} index lives outside this process: no snapshots")
        store = self._store(collection_id)
        with live.lock:
            count, live.watermark = self.source.apply_changes(
                collection_id, live.index, live.watermark
            )
            erase.erase_removed(self.db, collection_id, live)
            manifest = store.write(
                live.index,
                embedding_model=self.embedding_model_id,
                watermark=live.watermark,
                erased_to=live.erased_to,
            )
            live.generation = manifest.generation
            live.changes_since_snapshot = 0
        erase.drop_stale(self.db, collection_id, store)
        return manifest

    # ------------------------------------------------------------------ checking with SQL

    def check(self, collection_id: str) -> against_sql.Check:
        """Compare the index with SQL: counts and ids (rag.index.check)."""
        live = self._live(collection_id)
        if _shared(live.index):
            self.catch_up(collection_id)
        with live.lock:
            found = against_sql.check(self.db, self.source, collection_id, live)
            live.mismatch = found.mismatch
        return found

    def repair(self, collection_id: str) -> against_sql.Check:
        """Add what the index misses and erase what SQL no longer holds, then write a
        snapshot (none holds the loss any more); returns what the check found before. A
        Milvus index is rebuilt instead."""
        live = self._live(collection_id)
        if _shared(live.index):
            found = self.check(collection_id)
            if not found.ok:
                self.rebuild(collection_id, "milvus", live.index.params).result()
                self.check(collection_id)
            return found
        with live.lock:
            found = against_sql.repair(self.db, self.source, collection_id, live)
            live.mismatch = found.mismatch  # what was found (and fixed): the gauge shows it
        if not found.ok:
            log.warning(
                "index %s repaired: %d missing vectors added, %d extra erased",
                collection_id,
                found.missing,
                found.extra,
            )
            if not live.building:
                self.snapshot(collection_id)
        return found

    def check_counts(self) -> None:
        """Every open index's count against SQL (no lock held: searches never wait); one
        that differs is checked id by id and repaired."""
        for collection_id, live in self.lives():
            if _shared(live.index):
                continue
            found = against_sql.count_check(self.db, self.source, collection_id, live)
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
        """Erase what deletes removed, in memory and on disk: every open index erases its
        removed vectors and rewrites a snapshot older than a removal; snapshots of collections
        not open here that are older than a removal are deleted; a deleted collection's index
        and snapshots are dropped."""
        on_disk = collections_on_disk(self.data_dir)
        known = sorted(set(on_disk) | set(self.open_collections()))
        with self.db.read() as session:
            live_ids = collections.live_among(session, known)
        for collection_id in known:
            if collection_id not in live_ids:
                self.drop(collection_id)
        for collection_id, _live in self.lives():
            self.erase(collection_id)
        open_ids = set(self.open_collections())
        for collection_id in on_disk:
            if collection_id in live_ids and collection_id not in open_ids:
                erase.drop_stale(self.db, collection_id, self._store(collection_id))
        self.sweep_shared()  # Milvus collections of collections deleted anywhere

    def erase(self, collection_id: str) -> None:
        """Catch the open index up, erase the vectors of removed chunks from it, and rewrite
        its snapshot if one on disk is older than a removal."""
        live = self._lives.get(collection_id)
        if live is None:
            return
        if _shared(live.index):
            self.catch_up(collection_id, wait_s=0)
            erase.compact_removed(self.db, collection_id, live)
            return
        with live.lock:
            count, live.watermark = self.source.apply_changes(
                collection_id, live.index, live.watermark
            )
            live.changes_since_snapshot += count
            erase.erase_removed(self.db, collection_id, live)
        store = self._store(collection_id)
        if erase.stale_generations(self.db, collection_id, store) and not live.building:
            self.snapshot(collection_id)

    def drop(self, collection_id: str) -> None:
        """A deleted collection: its index leaves memory and its snapshots the disk."""
        if collection_id in self.open_collections():
            log.info("index %s: collection deleted; dropping its index", collection_id)
        self.forget(collection_id)
        self._store(collection_id).remove_all()
        if self.milvus is not None and self.milvus.uri:
            self._shared_indexes().drop(collection_id)  # its Milvus collection, if any

    def sweep_shared(self) -> int:
        """Drop the Milvus collections of collections deleted elsewhere (another replica's
        delete, a purge): returns how many went."""
        if self.milvus is None or not self.milvus.uri:
            return 0
        return self._shared_indexes().sweep()

    def _shared_indexes(self) -> SharedIndexes:
        if self._shared is None:
            if self.milvus is None or not self.milvus.uri:
                raise Invalid(
                    "index kind 'milvus' needs a Milvus server: set RAG_MILVUS__URI "
                    "(for example http://milvus:19530)"
                )
            from rag.index.milvus import MilvusEngine
            from rag.index.milvus.shared import SharedIndexes

            with self._lock:
                if self._shared is None:
                    self._shared = SharedIndexes(self.db, self.source, MilvusEngine(self.milvus))
        return self._shared

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
        """Drop the in-memory index; snapshots stay (`drop` removes those too)."""
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
        if self._shared is not None:
            self._shared.engine.close()

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
        if _shared_kind(spec.kind):
            shared = self._shared_indexes()
            handle, mark = shared.open(collection_id, spec.params)
            live = Live(collection_id, handle, mark, auto=False, erased_to=mark)
            with live.lock:
                _, live.watermark = shared.catch_up(collection_id, handle, mark, wait_s=30.0)
            return live
        store = self._store(collection_id)
        loaded = store.load_latest(embedding_model=self.embedding_model_id, dim=self.dim)
        if loaded is not None:
            live = Live(
                collection_id,
                loaded.index,
                loaded.manifest.watermark,
                auto=spec.auto,
                generation=loaded.manifest.generation,
                erased_to=loaded.manifest.erased_to,
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
            # No generation on disk yet: the background loop writes one. Built from live rows,
            # it holds no removed vector up to its watermark.
            live = Live(collection_id, index, watermark, auto=spec.auto, erased_to=watermark)
            live.changes_since_snapshot = max(len(index), 1)
        with live.lock:
            count, live.watermark = self.source.apply_changes(
                collection_id, live.index, live.watermark
            )
            live.changes_since_snapshot += count
            live.caught_up_at = time.monotonic()
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
            if _shared_kind(spec.kind):
                # A rebuild asked for (a kind given) builds anew; the maintenance loop's
                # (kind None) adopts a Milvus collection another replica built to this spec.
                shared, mark = self._shared_indexes().rebuild(
                    collection_id, spec.params, force=kind is not None
                )
                with live.lock:
                    live.index, live.watermark, live.auto = shared, mark, False
                    live.erased_to, live.generation = mark, None
                    live.changes_since_snapshot, live.stale = 0, False
                return live.state()
            index, built_at = self.source.build(collection_id, spec.kind, spec.params)
            # Catch the new index up outside the lock, then the last few rows inside it.
            _, watermark = self.source.apply_changes(collection_id, index, built_at)
            with live.lock:
                _, watermark = self.source.apply_changes(collection_id, index, watermark)
                live.index, live.watermark, live.auto = index, watermark, spec.auto
                live.erased_to = built_at  # what catch-up removed since is erased next
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


def _shared_kind(kind: str) -> bool:
    return kind != "auto" and bool(getattr(index_class(kind), "shared", False))


def _shared(index: VectorIndex) -> bool:
    return bool(getattr(index, "shared", False))
