"""The shared keeper (rag.index.keeper): Milvus-backed collections across replicas. Which
Milvus collection serves, one writer of the change log at a time, rebuilds into a new Milvus
collection swapped in when complete; no snapshots, and a mismatch with SQL is mended by a
rebuild.

Every replica holds a thin `MilvusIndex` handle per collection. A search first probes the
change log past the last watermark this process saw (one indexed query, as for the in-process
kinds); when there is something new it tries to become the collection's writer
(rag.db.milvus_collections.writer: a PostgreSQL advisory lock), applies the change log to
Milvus in order from the watermark recorded in SQL, and advances that watermark in the
lock's transaction. A replica that finds another writer at work waits (up to the search's
catch-up wait) for the shared watermark to pass what it saw, so a chunk is searchable on
every replica as soon as its ingest transaction commits, as with the in-process kinds.

Why a lock and not "the ingest worker writes as it commits": deletes are written by the API,
re-ingests and purges by others; several writers could apply one chunk's add and remove in
different orders and leave a deleted vector in Milvus with no change-log row left to fix it.
One writer replaying the log in seq order has no such race, a writer that dies leaves the
watermark where it was (the next one re-applies the batch: adds are upserts), and the
change log is already the record every other index catches up from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

from rag.db import Database, changelog
from rag.db import milvus_collections as bindings
from rag.errors import Invalid
from rag.index import erase
from rag.index.live import Live
from rag.index.milvus.engine import MilvusEngine
from rag.index.milvus.index import MilvusIndex
from rag.index.sync import Spec, SqlSource
from rag.index.verify import Check

log = logging.getLogger(__name__)

# A build claimed longer ago than this is presumed dead and may be taken over.
BUILD_STALE_S = 3600.0
# How often an idle replica re-reads which Milvus collection serves (a swap elsewhere).
REFRESH_S = 5.0


class SharedKeeper:
    def __init__(self, db: Database, source: SqlSource, engine: MilvusEngine) -> None:
        self.db = db
        self.source = source
        self.engine = engine
        self._refreshed: dict[str, float] = {}

    # ------------------------------------------------------------------ the keeper

    def open(self, collection_id: str, spec: Spec) -> Live:
        handle, mark = self._serving(collection_id, spec.params)
        live = Live(collection_id, handle, mark, auto=False, erased_to=mark)
        with live.lock:
            _, live.watermark = self._catch_up(collection_id, handle, mark, wait_s=30.0)
        return live

    def catch_up(self, live: Live, wait_s: float | None) -> int:
        count, live.watermark = self._catch_up(
            live.collection_id,
            _milvus(live),
            live.watermark,
            wait_s=30.0 if wait_s is None else wait_s,
        )
        return count

    def snapshot(self, live: Live) -> None:
        return None  # the index lives in Milvus

    def repair(self, live: Live) -> Check | None:
        return None  # Milvus's copy is mended by a rebuild from SQL

    def count_check(self, live: Live) -> Check | None:
        return None  # a count in Milvus lags its writes; `check` compares the ids

    def erase(self, live: Live) -> None:
        """The writer deleted removed chunks as it applied them; what is left is to have
        Milvus compact them out of its segments."""
        live.catch_up(self.catch_up, 0)
        erase.compact_removed(self.db, live.collection_id, live)

    def rebuild(self, live: Live, spec: Spec, *, asked: bool) -> None:
        # A rebuild asked for builds anew; the maintenance loop's adopts a Milvus collection
        # another replica built to this spec.
        index, mark = self._build(live.collection_id, spec.params, force=asked)
        with live.lock:
            live.index, live.watermark, live.auto = index, mark, False
            live.erased_to, live.generation = mark, None
            live.changes_since_snapshot, live.stale = 0, False

    def drop(self, collection_id: str) -> None:
        self._drop(collection_id)

    def sweep(self, open_ids: Collection[str]) -> int:
        """Drop the Milvus collections of deleted collections; returns how many went."""
        with self.db.read() as session:
            orphans = bindings.orphans(session)
        return sum(self._drop(b.collection_id) for b in orphans)

    def close(self) -> None:
        self.engine.close()

    # ------------------------------------------------------------------ opening

    def _serving(self, collection_id: str, params: dict[str, Any]) -> tuple[MilvusIndex, int]:
        """The collection's Milvus index and its shared watermark; built from SQL when no
        Milvus collection serves it yet (by one replica: the others wait for that build)."""
        with self.db.read() as session:
            binding = bindings.get(session, collection_id)
        if binding is not None and binding.name is not None:
            index = self._handle(collection_id, binding.name, binding.params)
            return index, binding.watermark
        return self._build(collection_id, params, force=False)

    def _handle(self, collection_id: str, name: str, params: dict[str, Any]) -> MilvusIndex:
        index = MilvusIndex(self.source.dim, **params)
        return index.bind(self.engine, name, resolve=lambda: self.current(collection_id))

    def current(self, collection_id: str) -> tuple[str, dict[str, Any]] | None:
        """The Milvus collection serving `collection_id` now, per SQL."""
        with self.db.read() as session:
            binding = bindings.get(session, collection_id)
        if binding is None or binding.name is None:
            return None
        return binding.name, binding.params

    # ------------------------------------------------------------------ catching up

    def _catch_up(
        self, collection_id: str, index: MilvusIndex, seen: int, wait_s: float
    ) -> tuple[int, int]:
        """Bring the Milvus copy up to the change log's head (this process writing, or
        another); returns (change-log rows this process applied, the watermark it now
        knows). The caller holds the collection's lock in this process."""
        with self.db.connect() as conn:
            newer = changelog.changes_after(conn, collection_id, seen, 1)
        if not newer:
            self._maybe_refresh(collection_id, index)
            return 0, seen
        target = newer[0][0]
        deadline = time.monotonic() + max(wait_s, 0.0)
        while True:
            with bindings.writer(self.db, collection_id, wait=False) as writer:
                if writer.held:
                    binding = writer.binding
                    if binding is None or binding.name is None:
                        return 0, seen  # not built yet: the build replays the log itself
                    if binding.name != index.name:
                        index.rebind(binding.name, binding.params)
                    count, mark = self.source.apply_changes(collection_id, index, binding.watermark)
                    if mark != binding.watermark and not writer.advance(
                        binding.name, binding.watermark, mark
                    ):
                        log.warning(
                            "milvus %s: the watermark moved under this writer", collection_id
                        )
                    return count, mark
            # Another replica is writing: wait for it to pass what we saw.
            with self.db.read() as session:
                binding = bindings.get(session, collection_id)
            if binding is not None and binding.watermark >= target:
                if binding.name is not None and binding.name != index.name:
                    index.rebind(binding.name, binding.params)
                return 0, binding.watermark
            if time.monotonic() >= deadline:
                return 0, seen
            time.sleep(0.02)

    def _maybe_refresh(self, collection_id: str, index: MilvusIndex) -> None:
        now = time.monotonic()
        if now - self._refreshed.get(collection_id, 0.0) < REFRESH_S:
            return
        self._refreshed[collection_id] = now
        current = self.current(collection_id)
        if current is not None and current[0] != index.name:
            index.rebind(*current)

    # ------------------------------------------------------------------ rebuilding

    def _build(
        self, collection_id: str, params: dict[str, Any], *, force: bool
    ) -> tuple[MilvusIndex, int]:
        """Fill a new Milvus collection from SQL, catch it up, and swap its name in (in the
        writer's transaction, so no batch lands in the old one after the swap); the old one
        is dropped. Without `force`, a Milvus collection already built with `params` is
        adopted as it is, and a build under way elsewhere is waited for."""
        MilvusIndex(self.source.dim, **params)  # refuse bad parameters before any work
        while True:
            with self.db.read() as session:
                binding = bindings.get(session, collection_id)
            if (
                not force
                and binding is not None
                and binding.name is not None
                and binding.params == _normal(params)
            ):
                return self._handle(collection_id, binding.name, binding.params), binding.watermark
            name = self.engine.new_name(collection_id)
            with self.db.write() as session:
                claimed = bindings.claim_build(session, collection_id, name, BUILD_STALE_S)
            if claimed:
                break
            log.info("milvus %s: a build is under way elsewhere; waiting", collection_id)
            self._wait_for_build(collection_id)
            force = False  # that build is the one we wanted
        try:
            index = MilvusIndex(self.source.dim, **params).bind(
                self.engine, name, resolve=lambda: self.current(collection_id)
            )
            watermark = self.source.fill(collection_id, index)
            index.flush()  # sealed and indexed before it serves
            _, watermark = self.source.apply_changes(collection_id, index, watermark)
            with bindings.writer(self.db, collection_id, wait=True) as writer:
                _, watermark = self.source.apply_changes(collection_id, index, watermark)
                old = writer.swap(name, index.params, watermark)
        except BaseException:
            with self.db.write() as session:
                bindings.abandon_build(session, collection_id, name)
            self._drop_quietly(name)
            raise
        if old is not None:
            self._drop_quietly(old)
        log.info("milvus %s: %s serving (%d vectors)", collection_id, name, len(index))
        return index, watermark

    def _wait_for_build(self, collection_id: str) -> None:
        deadline = time.monotonic() + BUILD_STALE_S
        while time.monotonic() < deadline:
            with self.db.read() as session:
                binding = bindings.get(session, collection_id)
            if binding is None or binding.building is None:
                return
            time.sleep(0.2)

    # ------------------------------------------------------------------ purging

    def _drop(self, collection_id: str) -> bool:
        """Drop the collection's Milvus collections and forget them (a deleted or purged
        collection). True when there was something to drop."""
        with self.db.write() as session:
            binding = bindings.remove(session, collection_id)
        if binding is None:
            return False
        for name in {binding.name, binding.building} - {None}:
            assert name is not None
            self._drop_quietly(name)
        return True

    def _drop_quietly(self, name: str) -> None:
        try:
            self.engine.drop(name)
        except Exception:
            log.exception("could not drop milvus collection %s (left for a later sweep)", name)


def _normal(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as a bound index reports them (defaults filled in)."""
    try:
        return MilvusIndex(1, **params).params
    except TypeError as exc:
        raise Invalid(f"bad parameters for a milvus index: {exc}") from exc


def _milvus(live: Live) -> MilvusIndex:
    """The live index as the Milvus index this keeper bound it to."""
    if not isinstance(live.index, MilvusIndex):
        raise TypeError(f"index {live.collection_id} is a {live.index.kind}: not kept in Milvus")
    return live.index
