"""The local keeper: an index in this process's memory, snapshots on disk, change-log catch-up.

Opening loads the newest snapshot generation that verifies (or builds from SQL rows when there
is none) and applies change-log rows past its watermark. Deletes are tombstoned by catch-up at
once and erased for good by the purge: from memory (`VectorIndex.erase`) and from the disk (a
generation older than a removal is rewritten or deleted). A rebuild fills a new index from SQL
and swaps it in under the lock: a search holds one whole index, never a half-built one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from pathlib import Path

from rag.db import Database, collections
from rag.index import erase
from rag.index import verify as against_sql
from rag.index.live import Live
from rag.index.snapshot import Manifest, SnapshotStore, collections_on_disk
from rag.index.sync import Spec, SqlSource

log = logging.getLogger(__name__)


class LocalKeeper:
    def __init__(
        self,
        db: Database,
        source: SqlSource,
        data_dir: Path,
        *,
        keep_generations: int,
    ) -> None:
        self.db = db
        self.source = source
        self.data_dir = Path(data_dir)
        self.keep_generations = keep_generations

    def store(self, collection_id: str) -> SnapshotStore:
        return SnapshotStore(self.data_dir, collection_id, keep=self.keep_generations)

    def open(self, collection_id: str, spec: Spec) -> Live:
        store = self.store(collection_id)
        loaded = store.load_latest(
            embedding_model=self.source.embedding_model_id, dim=self.source.dim
        )
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
            self.catch_up(live, None)
            live.caught_up_at = time.monotonic()
        return live

    def catch_up(self, live: Live, wait_s: float | None) -> int:
        count, live.watermark = self.source.apply_changes(
            live.collection_id, live.index, live.watermark
        )
        live.changes_since_snapshot += count
        return count

    def snapshot(self, live: Live) -> Manifest:
        """Write the live index as a new generation (after catching up and erasing what was
        removed: no generation holds a removed vector), then delete the generations older
        than the collection's last removal."""
        store = self.store(live.collection_id)
        with live.lock:
            _, live.watermark = self.source.apply_changes(
                live.collection_id, live.index, live.watermark
            )
            erase.erase_removed(self.db, live.collection_id, live)
            manifest = store.write(
                live.index,
                embedding_model=self.source.embedding_model_id,
                watermark=live.watermark,
                erased_to=live.erased_to,
            )
            live.generation = manifest.generation
            live.changes_since_snapshot = 0
        erase.drop_stale(self.db, live.collection_id, store)
        return manifest

    def repair(self, live: Live) -> against_sql.Check:
        """Add what the index misses and erase what SQL no longer holds, then write a
        snapshot (none holds the loss any more)."""
        with live.lock:
            found = against_sql.repair(self.db, self.source, live.collection_id, live)
            live.mismatch = found.mismatch  # what was found (and fixed): the gauge shows it
        if not found.ok:
            log.warning(
                "index %s repaired: %d missing vectors added, %d extra erased",
                live.collection_id,
                found.missing,
                found.extra,
            )
            if not live.building:
                self.snapshot(live)
        return found

    def count_check(self, live: Live) -> against_sql.Check | None:
        return against_sql.count_check(self.db, self.source, live.collection_id, live)

    def erase(self, live: Live) -> None:
        """Erase the vectors of removed chunks from the index, and rewrite its snapshot if one
        on disk is older than a removal."""
        with live.lock:
            self.catch_up(live, None)
            erase.erase_removed(self.db, live.collection_id, live)
        store = self.store(live.collection_id)
        if erase.stale_generations(self.db, live.collection_id, store) and not live.building:
            self.snapshot(live)

    def rebuild(self, live: Live, spec: Spec, *, asked: bool) -> None:
        index, built_at = self.source.build(live.collection_id, spec.kind, spec.params)
        # Catch the new index up outside the lock, then the last few rows inside it.
        _, watermark = self.source.apply_changes(live.collection_id, index, built_at)
        with live.lock:
            _, watermark = self.source.apply_changes(live.collection_id, index, watermark)
            live.index, live.watermark, live.auto = index, watermark, spec.auto
            live.erased_to = built_at  # what catch-up removed since is erased next
            live.generation = None
            live.changes_since_snapshot = max(len(index), 1)
            live.stale = False
        log.info("index %s swapped: %s, %d vectors", live.collection_id, spec.kind, len(index))

    def drop(self, collection_id: str) -> None:
        self.store(collection_id).remove_all()

    def sweep(self, open_ids: Collection[str]) -> int:
        """Snapshots of deleted collections go; those of live collections not open here that
        are older than a removal are deleted (an open index rewrites its own)."""
        on_disk = collections_on_disk(self.data_dir)
        with self.db.read() as session:
            live_ids = collections.live_among(session, on_disk)
        dropped = 0
        for collection_id in on_disk:
            if collection_id not in live_ids:
                self.drop(collection_id)
                dropped += 1
            elif collection_id not in open_ids:
                erase.drop_stale(self.db, collection_id, self.store(collection_id))
        return dropped

    def close(self) -> None:
        return None
