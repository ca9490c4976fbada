"""An index checked against SQL, and repaired from it.

An index is a cache of the record (rag.index.manager): what it holds should be exactly the
live chunks of its collection embedded with its model. `check` compares the count and the
ids, `repair` adds what is missing (vectors read from SQL) and erases what SQL no longer
holds. Both run under the collection's lock, once the index has caught up, so a change
committed meanwhile is never counted as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rag.db import Database, changelog, chunks
from rag.index.base import Ids
from rag.index.live import Live
from rag.index.sync import SqlSource

# How many ids of each side a report lists.
SAMPLE = 20
# Catch-ups tried before comparing anyway (changes kept arriving).
_SETTLE_TRIES = 3


@dataclass(frozen=True)
class Check:
    collection_id: str
    kind: str
    index_count: int
    sql_count: int
    missing: int  # ids in SQL, not in the index
    extra: int  # ids in the index, not in SQL
    missing_sample: tuple[int, ...] = ()
    extra_sample: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.index_count == self.sql_count and not self.missing and not self.extra

    @property
    def mismatch(self) -> int:
        return max(self.missing + self.extra, abs(self.index_count - self.sql_count))


def count_check(db: Database, source: SqlSource, collection_id: str, live: Live) -> Check | None:
    """Counts only, without the lock (what the maintenance loop runs: searches never wait
    for it); None when the index moved or was behind meanwhile (try again later)."""
    mark, index = live.watermark, live.index
    n = len(index)
    with db.read() as session:
        sql_count = chunks.live_count(session, collection_id, source.embedding_model_id)
        head = changelog.head(session, collection_id)
    if live.building or head != mark or live.watermark != mark or live.index is not index:
        return None
    return Check(
        collection_id, index.kind, n, sql_count, max(sql_count - n, 0), max(n - sql_count, 0)
    )


def check(db: Database, source: SqlSource, collection_id: str, live: Live) -> Check:
    """Counts and ids; the caller holds live.lock."""
    index_ids, sql_ids = _settled(db, source, collection_id, live)
    missing = np.setdiff1d(sql_ids, index_ids, assume_unique=True)
    extra = np.setdiff1d(index_ids, sql_ids, assume_unique=True)
    return Check(
        collection_id,
        live.index.kind,
        len(live.index),
        len(sql_ids),
        len(missing),
        len(extra),
        tuple(int(i) for i in missing[:SAMPLE]),
        tuple(int(i) for i in extra[:SAMPLE]),
    )


def repair(db: Database, source: SqlSource, collection_id: str, live: Live) -> Check:
    """Add the missing ids' vectors, erase the extra ids; returns what was found before.
    The caller holds live.lock."""
    index_ids, sql_ids = _settled(db, source, collection_id, live)
    found = check(db, source, collection_id, live)
    extra = np.setdiff1d(index_ids, sql_ids, assume_unique=True)
    if len(extra):
        live.index.erase(extra)
    missing = np.setdiff1d(sql_ids, index_ids, assume_unique=True).tolist()
    for start in range(0, len(missing), source.catch_up_batch):
        batch = missing[start : start + source.catch_up_batch]
        with db.read() as session:
            ids, vectors = chunks.vectors_of(
                session, collection_id, source.embedding_model_id, source.dim, batch
            )
        if len(ids):
            source.add_vectors(collection_id, live.index, ids, vectors)
    if len(missing) or len(extra):
        live.changes_since_snapshot += len(missing) + len(extra)
    return found


def _settled(db: Database, source: SqlSource, collection_id: str, live: Live) -> tuple[Ids, Ids]:
    """The index's ids and SQL's live ids at the same watermark (sorted, unique)."""
    for _ in range(_SETTLE_TRIES):
        count, live.watermark = source.apply_changes(collection_id, live.index, live.watermark)
        live.changes_since_snapshot += count
        with db.read() as session:
            sql_ids = chunks.live_ids(session, collection_id, source.embedding_model_id)
            head = changelog.head(session, collection_id)
        if head <= live.watermark:
            break
    index_ids = np.unique(live.index.ids().astype(np.int64, copy=False))
    return index_ids, np.unique(sql_ids)
