"""The background loop that keeps every open index caught up, snapshotted and of the right
kind: it catches up, writes a snapshot after many changes, and rebuilds when an index outgrew
its kind, needs retraining, holds too many tombstones, or the collection now declares another
kind (changed by `rag index rebuild` in another process, or on another replica). Every
`erase_interval_s` it has the manager purge what deletes removed (rag.index.manager) and
compare each index's count with SQL (repairing one that differs), and an index whose
collection was deleted is dropped as soon as the loop notices. At start it checks the indexes
of collections whose chunk ids SQLite reused before migration 0008."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any, Protocol

from rag.errors import NotFound
from rag.index import EXACT_MAX, default_kind_for
from rag.index.live import IndexState, Live
from rag.index.sync import SqlSource

log = logging.getLogger(__name__)

# How often the loop re-reads a collection's declared kind (seconds).
SPEC_CHECK_S = 5.0


class Maintained(Protocol):
    """What the loop asks of the index manager."""

    snapshot_every: int

    def lives(self) -> Iterable[tuple[str, Live]]: ...
    def catch_up(self, collection_id: str, *, wait_s: float | None = None) -> int: ...
    def rebuild(
        self, collection_id: str, kind: str | None = None, params: dict[str, Any] | None = None
    ) -> Future[IndexState]: ...
    def snapshot(self, collection_id: str) -> Any: ...
    def purge(self) -> None: ...
    def check_counts(self) -> None: ...
    def check_reused(self) -> None: ...
    def drop(self, collection_id: str) -> None: ...


class Maintainer:
    def __init__(
        self,
        manager: Maintained,
        source: SqlSource,
        interval_s: float,
        erase_interval_s: float = 60.0,
    ) -> None:
        self.manager = manager
        self.source = source
        self.interval_s = interval_s
        self.erase_interval_s = erase_interval_s
        self._purged_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-catch-up", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            self.manager.check_reused()
        except Exception:
            log.exception("index check at start-up failed")
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        for collection_id, live in list(self.manager.lives()):
            try:
                self.maintain(collection_id, live)
            except NotFound:  # deleted (here or elsewhere) since it was opened
                self.manager.drop(collection_id)
            except Exception:
                log.exception("index maintenance failed for collection %s", collection_id)
        if time.monotonic() - self._purged_at >= self.erase_interval_s:
            self._purged_at = time.monotonic()
            try:
                self.manager.purge()
            except Exception:
                log.exception("index purge failed")
            try:
                self.manager.check_counts()
            except Exception:
                log.exception("index check against SQL failed")

    def maintain(self, collection_id: str, live: Live) -> None:
        if live.lock.locked():  # a search or snapshot is applying changes right now
            return
        self.manager.catch_up(collection_id, wait_s=0)
        index = live.index
        n = len(index)
        if not live.building and self.declared_elsewhere(collection_id, live):
            log.info("index %s: the collection declares another kind; rebuilding", collection_id)
            self.manager.rebuild(collection_id)
            return
        outgrown = live.auto and index.kind != default_kind_for(n) and n >= EXACT_MAX
        retrain = index.needs_retrain
        tombstones = index.deleted_count
        if not live.building and (outgrown or retrain or tombstones > max(1000, n)):
            log.info(
                "index %s: rebuilding (outgrown=%s retrain=%s tombstones=%d)",
                collection_id,
                outgrown,
                retrain,
                tombstones,
            )
            self.manager.rebuild(collection_id)
        elif not live.building and live.changes_since_snapshot >= min(
            self.manager.snapshot_every, n or 1
        ):
            self.manager.snapshot(collection_id)

    def declared_elsewhere(self, collection_id: str, live: Live) -> bool:
        """True when the collection row now declares another kind or parameters than the
        live index has: every replica then rebuilds from SQL into what the row says."""
        now = time.monotonic()
        if now - live.spec_checked_at < SPEC_CHECK_S:
            return False
        live.spec_checked_at = now
        spec = self.source.spec(collection_id)
        if spec.auto:
            return not live.auto
        current = {k: v for k, v in live.index.params.items() if k in spec.params}
        return spec.kind != live.index.kind or current != spec.params
