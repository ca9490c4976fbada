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
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from rag.db.models import ChangeLog, Chunk, Collection, Document
from rag.db.session import Database
from rag.errors import Invalid, NotFound
from rag.index import EXACT_MAX, build_index, default_kind_for
from rag.index.base import Allowed, Hits, Ids, SearchParams, VectorIndex, Vectors
from rag.index.snapshot import Manifest, SnapshotStore

log = logging.getLogger(__name__)

_CHANGES_AFTER = (
    select(ChangeLog.seq, ChangeLog.op, ChangeLog.chunk_id)
    .where(ChangeLog.collection_id == bindparam("cid"), ChangeLog.seq > bindparam("mark"))
    .order_by(ChangeLog.seq)
    .limit(bindparam("n"))
)

_BUILD_BATCH = 5000
# How often the background loop re-reads a collection's declared kind (seconds).
SPEC_CHECK_S = 5.0


@dataclass(frozen=True)
class IndexState:
    collection_id: str
    kind: str
    count: int
    watermark: int  # the last change-log seq applied
    generation: int | None  # the snapshot generation it started from, if any
    building: bool  # a rebuild is running in the background
    stale: bool  # the last catch-up did not finish: results may miss recent changes


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hits]
    state: IndexState


@dataclass
class _Live:
    collection_id: str
    index: VectorIndex
    watermark: int
    auto: bool  # kind follows the collection's size
    generation: int | None = None
    changes_since_snapshot: int = 0
    building: bool = False
    stale: bool = False
    spec_checked_at: float = 0.0

    def __post_init__(self) -> None:
        # Held while changes are applied, snapshots written and rebuilds swapped in.
        self.lock = threading.Lock()


@dataclass(frozen=True)
class _Spec:
    kind: str
    params: dict[str, Any]
    auto: bool


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
        self.catch_up_batch = catch_up_batch
        self.snapshot_every = snapshot_every
        self.keep_generations = keep_generations
        self._lives: dict[str, _Live] = {}
        self._open_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._builds: dict[str, Future[IndexState]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index-build")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------ public API

    def get(self, collection_id: str) -> VectorIndex:
        """The live index, opened (and caught up) on first use."""
        return self._live(collection_id).index

    def state(self, collection_id: str) -> IndexState:
        return self._state(self._live(collection_id))

    def search(
        self,
        collection_id: str,
        queries: Vectors,
        params: SearchParams | None = None,
        allowed_ids: Allowed | None = None,
    ) -> SearchOutcome:
        live = self._live(collection_id)
        self.catch_up(collection_id, wait_s=self.catch_up_wait_s)
        index = live.index  # one whole index for this search, even if a rebuild swaps now
        hits = index.search(queries, params or SearchParams(), allowed_ids)
        return SearchOutcome(hits, self._state(live))

    def catch_up(self, collection_id: str, *, wait_s: float | None = None) -> int:
        """Apply change-log rows past the watermark; returns how many were applied.

        With `wait_s`, gives up (and marks the index stale) if another thread is applying
        changes for longer than that; the caller then searches what is there."""
        live = self._live(collection_id)
        if not live.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            live.stale = True
            return 0
        try:
            applied = self._apply_changes(collection_id, live.index, live.watermark)
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
            count, live.watermark = self._apply_changes(collection_id, live.index, live.watermark)
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

    def forget(self, collection_id: str) -> None:
        """Drop the in-memory index (a deleted collection); snapshots stay until pruned."""
        with self._lock:
            self._lives.pop(collection_id, None)

    def start(self, interval_s: float = 0.5) -> None:
        """Catch up every open collection in the background, snapshot after many changes,
        and rebuild when the index outgrows its kind or collects too many tombstones."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval_s,), name="index-catch-up", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    # -------------------------------------------------------------------------- opening

    def _store(self, collection_id: str) -> SnapshotStore:
        return SnapshotStore(self.data_dir, collection_id, keep=self.keep_generations)

    def _live(self, collection_id: str) -> _Live:
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

    def _spec(self, session: Session, collection_id: str) -> _Spec:
        collection = session.get(Collection, collection_id)
        if collection is None or collection.deleted_at is not None:
            raise NotFound(f"collection {collection_id} not found")
        if (
            collection.embedding_model != self.embedding_model_id
            or collection.embedding_dim != self.dim
        ):
            raise Invalid(
                f"collection {collection_id} uses {collection.embedding_model} "
                f"({collection.embedding_dim}-d); this index serves {self.embedding_model_id} "
                f"({self.dim}-d)"
            )
        kind = collection.index_kind or "auto"
        if kind == "auto":
            return _Spec(default_kind_for(self._count(session, collection_id)), {}, True)
        return _Spec(kind, dict(collection.index_params or {}), False)

    def _open(self, collection_id: str) -> _Live:
        with self.db.read() as session:
            spec = self._spec(session, collection_id)
        store = self._store(collection_id)
        loaded = store.load_latest(embedding_model=self.embedding_model_id, dim=self.dim)
        if loaded is not None:
            live = _Live(
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
            index, watermark = self._build_from_sql(collection_id, spec.kind, spec.params)
            # No generation on disk yet: the background loop writes one.
            live = _Live(collection_id, index, watermark, auto=spec.auto)
            live.changes_since_snapshot = max(len(index), 1)
        with live.lock:
            count, live.watermark = self._apply_changes(collection_id, live.index, live.watermark)
            live.changes_since_snapshot += count
        return live

    # ------------------------------------------------------------------------ SQL → index

    def _count(self, session: Session, collection_id: str) -> int:
        return int(
            session.scalar(select(func.count(Chunk.id)).where(Chunk.collection_id == collection_id))
            or 0
        )

    def _build_from_sql(
        self, collection_id: str, kind: str, params: dict[str, Any]
    ) -> tuple[VectorIndex, int]:
        index = build_index(kind, self.dim, params)
        # The watermark is read first: anything committed after it is replayed by catch-up,
        # and replaying a change the rows already reflect is harmless (add replaces).
        with self.db.read() as session:
            watermark = self._head(session, collection_id)
        with self.db.read() as session:
            query = (
                self._live_chunks(select(Chunk.id, Chunk.embedding))
                .where(Chunk.collection_id == collection_id)
                .order_by(Chunk.id)
                .execution_options(yield_per=_BUILD_BATCH)
            )
            for batch in _batched(session.execute(query), _BUILD_BATCH):
                ids, vectors = self._decode(batch)
                index.add(ids, vectors)
        log.info(
            "index %s built from SQL: %s, %d vectors, watermark %d",
            collection_id,
            kind,
            len(index),
            watermark,
        )
        return index, watermark

    def _head(self, session: Session, collection_id: str) -> int:
        head = session.scalar(
            select(func.max(ChangeLog.seq)).where(ChangeLog.collection_id == collection_id)
        )
        return int(head or 0)

    def _live_chunks(self, query: Any) -> Any:
        """Chunks whose document is not tombstoned, embedded with this index's model."""
        return query.join(Document, Document.id == Chunk.document_id).where(
            Document.deleted_at.is_(None), Chunk.embedding_model == self.embedding_model_id
        )

    def _decode(self, rows: Iterable[Any]) -> tuple[Ids, Vectors]:
        ids: list[int] = []
        vectors: list[np.ndarray[Any, Any]] = []
        for chunk_id, blob in rows:
            vector = np.frombuffer(blob, dtype="<f4")
            if vector.shape[0] != self.dim:
                log.warning("chunk %d has a %d-d embedding; skipped", chunk_id, vector.shape[0])
                continue
            ids.append(int(chunk_id))
            vectors.append(vector)
        if not ids:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        return np.array(ids, dtype=np.int64), np.vstack(vectors).astype(np.float32)

    def _apply_changes(
        self, collection_id: str, index: VectorIndex, watermark: int
    ) -> tuple[int, int]:
        """Apply change-log rows after `watermark` to `index`; returns (rows, new watermark).
        The caller holds the collection's lock."""
        applied = 0
        while True:
            # The probe runs before every search: a prebuilt statement on a bare connection
            # costs a fraction of an ORM session's round trip when (as usual) nothing is new.
            with self.db.connect() as conn:
                rows = conn.execute(
                    _CHANGES_AFTER,
                    {"cid": collection_id, "mark": watermark, "n": self.catch_up_batch},
                ).all()
            if not rows:
                return applied, watermark
            with self.db.read() as session:
                # Only the last change to a chunk matters within a batch.
                final: dict[int, str] = {}
                for _seq, op, chunk_id in rows:
                    final[int(chunk_id)] = op
                wanted = [c for c, op in final.items() if op == "add"]
                found: tuple[Ids, Vectors] = (
                    np.zeros(0, np.int64),
                    np.zeros((0, self.dim), np.float32),
                )
                if wanted:
                    found = self._decode(
                        session.execute(
                            self._live_chunks(select(Chunk.id, Chunk.embedding)).where(
                                Chunk.id.in_(wanted), Chunk.collection_id == collection_id
                            )
                        )
                    )
            ids, vectors = found
            present = set(ids.tolist())
            # An add whose chunk is gone or whose document is tombstoned is a remove.
            gone = [c for c, op in final.items() if op != "add" or c not in present]
            if gone:
                index.remove(np.array(gone, dtype=np.int64))
            if len(ids):
                index.add(ids, vectors)
            applied += len(rows)
            watermark = int(rows[-1][0])
            if len(rows) < self.catch_up_batch:
                return applied, watermark

    # ------------------------------------------------------------------------ rebuilding

    def _rebuild(
        self,
        collection_id: str,
        live: _Live,
        kind: str | None,
        params: dict[str, Any] | None,
        snapshot: bool,
    ) -> IndexState:
        try:
            if kind is None:
                with self.db.read() as session:
                    spec = self._spec(session, collection_id)
            else:
                spec = _Spec(kind, dict(params or {}), False)
            index, watermark = self._build_from_sql(collection_id, spec.kind, spec.params)
            # Catch the new index up outside the lock, then the last few rows inside it.
            _, watermark = self._apply_changes(collection_id, index, watermark)
            with live.lock:
                _, watermark = self._apply_changes(collection_id, index, watermark)
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
        return self._state(live)

    def _declared_elsewhere(self, collection_id: str, live: _Live) -> bool:
        """True when the collection row now declares another kind or parameters than the
        live index has (`rag index rebuild` in another process, or another replica): every
        replica then rebuilds from SQL into what the row says."""
        now = time.monotonic()
        if now - live.spec_checked_at < SPEC_CHECK_S:
            return False
        live.spec_checked_at = now
        with self.db.read() as session:
            spec = self._spec(session, collection_id)
        if spec.auto:
            return not live.auto
        current = {k: v for k, v in live.index.params.items() if k in spec.params}
        return spec.kind != live.index.kind or current != spec.params

    def _maintain(self, collection_id: str, live: _Live) -> None:
        if live.lock.locked():  # a search or snapshot is applying changes right now
            return
        self.catch_up(collection_id, wait_s=0)
        index = live.index
        n = len(index)
        if not live.building and self._declared_elsewhere(collection_id, live):
            log.info("index %s: the collection declares another kind; rebuilding", collection_id)
            self.rebuild(collection_id)
            return
        outgrown = live.auto and index.kind != default_kind_for(n) and n >= EXACT_MAX
        retrain = bool(getattr(index, "needs_retrain", False))
        tombstones = int(getattr(index, "deleted_count", 0))
        if not live.building and (outgrown or retrain or tombstones > max(1000, n)):
            log.info(
                "index %s: rebuilding (outgrown=%s retrain=%s tombstones=%d)",
                collection_id,
                outgrown,
                retrain,
                tombstones,
            )
            self.rebuild(collection_id)
        elif not live.building and live.changes_since_snapshot >= min(self.snapshot_every, n or 1):
            self.snapshot(collection_id)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            for collection_id, live in list(self._lives.items()):
                try:
                    self._maintain(collection_id, live)
                except Exception:
                    log.exception("index maintenance failed for collection %s", collection_id)

    def _state(self, live: _Live) -> IndexState:
        index = live.index
        return IndexState(
            collection_id=live.collection_id,
            kind=index.kind,
            count=len(index),
            watermark=live.watermark,
            generation=live.generation,
            building=live.building,
            stale=live.stale,
        )


def _batched(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
