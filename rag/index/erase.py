"""What a purge does to one collection's index once its deletes are caught up: erase the
removed chunks' vectors from memory (or have Milvus compact them away) and find or drop the
snapshot generations that are older than a removal (they may still hold its vector)."""

from __future__ import annotations

import numpy as np

from rag.db import Database, changelog, chunks
from rag.index.live import Live
from rag.index.snapshot import SnapshotStore


def erase_removed(db: Database, collection_id: str, live: Live) -> None:
    """Erase the chunks removed in (erased_to, watermark]; the caller holds live.lock.

    An id the record holds live again is left alone: before migration 0008 SQLite handed a
    purged id out again, and catch-up has already added the new chunk under it."""
    if live.erased_to >= live.watermark:
        return
    with db.connect() as conn:
        removed = set(
            changelog.removed_between(conn, collection_id, live.erased_to, live.watermark)
        )
        if removed:
            removed -= chunks.live_among(conn, collection_id, sorted(removed))
    if removed:
        live.index.erase(np.array(sorted(removed), dtype=np.int64))
    live.erased_to = live.watermark


def compact_removed(db: Database, collection_id: str, live: Live) -> None:
    """An index in a shared engine (caught up): the writer deleted removed chunks as it
    applied them; what is left is to have the engine compact them out of its storage."""
    if live.erased_to >= live.watermark:
        return
    with db.connect() as conn:
        removed = changelog.removed_between(conn, collection_id, live.erased_to, live.watermark)
    if removed:
        live.index.compact()
    live.erased_to = live.watermark


def stale_generations(db: Database, collection_id: str, store: SnapshotStore) -> list[int]:
    """Generations older than a removal of the collection (they may hold its vector)."""
    marks = store.watermarks()
    if not marks:
        return []
    with db.read() as session:
        removal = changelog.last_removal_after(session, collection_id, min(marks.values()))
    return [g for g, w in marks.items() if w < removal]


def drop_stale(db: Database, collection_id: str, store: SnapshotStore) -> None:
    """Delete the generations older than the last removal (or a crashed writer's temporary)."""
    marks = store.watermarks()
    if not marks:
        store.prune()  # a temporary a crashed writer left
        return
    with db.read() as session:
        removal = changelog.last_removal_after(session, collection_id, min(marks.values()))
    if removal:
        store.drop_older_than(removal)
    else:
        store.prune()
