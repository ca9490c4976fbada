"""The purge loop: within a bounded time after a delete, what was deleted is gone.

Every process runs one (`rag serve` and `rag worker`, started by rag.services). Each round,
every `interval_s`:

1. erase tombstoned documents from the record in batches (with the conversation turns their
   passages served), then deleted conversations and those past the retention, then deleted
   collections' rows and conversations (rag.db.purge: rows, text, full-text entries,
   vectors, the tenant's blob when unused, and the answers, feedback and drift windows of
   either), then answers past their retention (quality.retention_days);
2. make the bytes leave the database's files (rag.db.purge.reclaim);
3. tell this process's listeners which chunks left the record since the last round.

The index side runs in the index maintenance thread (rag.index.maintenance): removed vectors
are erased from memory and from snapshots, and a deleted collection's index and snapshots are
dropped, on the same interval.

Listeners are how a cache of derived data (the engine's prefix and passage KV caches) learns
of deletes, in every process: they are called with the `Removed` chunks read from the change
log's "remove" entries, whichever process deleted or purged them. A chunk appears there when
its document is deleted (at once) or, for a deleted collection, when it is purged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rag.background import Thread
from rag.config import PurgeSettings
from rag.db import Database, changelog
from rag.db import purge as sql
from rag.db.models import now

log = logging.getLogger(__name__)

_FEED_BATCH = 5000


@dataclass(frozen=True)
class Removed:
    """Chunks of one document that left the record: what was derived from them must go."""

    collection_id: str
    document_id: str
    chunk_ids: tuple[int, ...]


Listener = Callable[[list[Removed]], None]


@dataclass(frozen=True)
class Round:
    documents: int  # erased from the record by this process
    collections: int
    conversations: int
    reclaimed: bool  # the files were compacted (or there was nothing to do)
    removed: int  # chunk removals told to the listeners


class Purger:
    def __init__(
        self,
        db: Database,
        settings: PurgeSettings,
        retention_s: float | None = None,
        answers_retention_s: float | None = None,
    ) -> None:
        """`retention_s`: conversations untouched this long are erased (None: kept);
        `answers_retention_s`: answers (rag.quality) older than this are (None: kept)."""
        self.db = db
        self.settings = settings
        self.retention_s = retention_s
        self.answers_retention_s = answers_retention_s
        self._listeners: list[Listener] = []
        self._feed_mark: int | None = None
        # A process that starts finishes a reclaim a crash may have cut short.
        self._reclaim_due = True
        self._loop = Thread("purge", self._run)
        self._round = threading.Lock()  # one round at a time (the loop, or a test's call)

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` with every batch of chunk removals from now on (in the purge
        thread: it should be quick, and must not raise)."""
        if self._feed_mark is None:
            self._feed_mark = self._head()
        self._listeners.append(listener)

    def run_once(self) -> Round:
        with self._round:
            return self._round_locked()

    def _round_locked(self) -> Round:
        documents = 0
        while True:
            batch = sql.purge_documents(self.db, self.settings.batch)
            documents += len(batch)
            for item in batch:
                log.info(
                    "purged document %s (%d chunks) of collection %s",
                    item.document_id,
                    len(item.chunk_ids),
                    item.collection_id,
                )
            if len(batch) < self.settings.batch:
                break
        conversations = 0
        while True:
            ids = sql.purge_conversations(self.db, self.retention_s, self.settings.batch)
            conversations += len(ids)
            if len(ids) < self.settings.batch:
                break
        if conversations:
            log.info("purged %d conversations", conversations)
        collections = sql.purge_collections(self.db)
        for collection_id in collections:
            log.info("purged collection %s", collection_id)
        expired = 0
        if self.answers_retention_s is not None:
            expired = sql.expire_answers(
                self.db, now() - self.answers_retention_s, self.settings.batch
            )
        reclaimed = True
        erased = bool(documents or collections or conversations or expired)
        if erased or self._reclaim_due:
            reclaimed = sql.reclaim(
                self.db, full_vacuum=self.settings.postgres_vacuum == "full", convert=erased
            )
            self._reclaim_due = not reclaimed
        removed = self._publish()
        return Round(documents, len(collections), conversations, reclaimed, removed)

    def _head(self) -> int:
        with self.db.connect() as conn:
            return changelog.last_seq(conn)

    def _publish(self) -> int:
        if not self._listeners or self._feed_mark is None:
            return 0
        told = 0
        while True:
            with self.db.connect() as conn:
                rows = changelog.removals_after(conn, self._feed_mark, _FEED_BATCH)
            if not rows:
                return told
            grouped: dict[tuple[str, str], list[int]] = {}
            for _seq, collection_id, document_id, chunk_id in rows:
                grouped.setdefault((collection_id, document_id), []).append(chunk_id)
            removed = [Removed(c, d, tuple(ids)) for (c, d), ids in grouped.items()]
            for listener in self._listeners:
                try:
                    listener(removed)
                except Exception:
                    log.exception("a purge listener failed")
            self._feed_mark = rows[-1][0]
            told += len(rows)
            if len(rows) < _FEED_BATCH:
                return told

    # ------------------------------------------------------------------ the background loop

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    def _run(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:
                log.exception(
                    "purge round failed; trying again in %.0f s", self.settings.interval_s
                )
            if self._loop.stop.wait(self.settings.interval_s):
                return
