"""Which Milvus collection serves a ragserve collection, and how far it has caught up.

Milvus holds a derived copy of a collection's vectors, shared by every replica; SQL records
the Milvus collection's name (a rebuild fills a new one and swaps the name here, in one
transaction, so every replica follows it: Milvus Lite has no aliases, and a name in SQL works
the same on every Milvus), the parameters it was built with, and the change-log watermark it
reflects. One writer at a time applies the change log to it:

- PostgreSQL: the writer holds a transaction-scoped advisory lock keyed by the collection
  while it applies a batch and advances the watermark in that same transaction, so replicas
  that share the database agree on one writer, and a writer that dies releases the lock with
  its connection (the watermark did not move, so the next writer re-applies the batch).
- SQLite: one process is the norm (the database is a file on one machine); the index
  manager's per-collection lock orders writers within it, and advancing the watermark is a
  compare-and-set, so a second process (an operator's `rag index rebuild`) can never move it
  backwards.

The row has no foreign key to its collection: it must outlive a purged collection until its
Milvus collection has been dropped.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.orm import Session

from rag.db.models import Collection, MilvusCollection, now
from rag.db.session import Database


@dataclass(frozen=True)
class Binding:
    collection_id: str
    name: str | None
    params: dict[str, Any]
    watermark: int
    building: str | None
    build_started_at: float | None


def _binding(row: MilvusCollection) -> Binding:
    return Binding(
        row.collection_id,
        row.name,
        dict(row.params or {}),
        int(row.watermark or 0),
        row.building,
        row.build_started_at,
    )


def get(session: Session, collection_id: str) -> Binding | None:
    row = session.get(MilvusCollection, collection_id)
    return None if row is None else _binding(row)


def claim_build(session: Session, collection_id: str, name: str, stale_after_s: float) -> bool:
    """Record that `name` is being built for the collection, unless another build is under
    way (and younger than `stale_after_s`). True when the claim is ours."""
    t = now()
    row = session.get(MilvusCollection, collection_id, with_for_update=True)
    if row is None:
        session.add(
            MilvusCollection(
                collection_id=collection_id,
                name=None,
                params={},
                watermark=0,
                building=name,
                build_started_at=t,
                updated_at=t,
            )
        )
        session.flush()
        return True
    if row.building is not None and (row.build_started_at or 0) > t - stale_after_s:
        return False
    row.building, row.build_started_at, row.updated_at = name, t, t
    return True


def finish_build(
    session: Session, collection_id: str, name: str, params: dict[str, Any], watermark: int
) -> str | None:
    """Swap `name` in as the collection's Milvus collection; returns the one it replaces."""
    row = session.get(MilvusCollection, collection_id, with_for_update=True)
    if row is None:  # the binding was removed (collection dropped) while we built
        return name
    old = row.name
    row.name, row.params, row.watermark = name, dict(params), int(watermark)
    if row.building == name:
        row.building, row.build_started_at = None, None
    row.updated_at = now()
    return old if old != name else None


def abandon_build(session: Session, collection_id: str, name: str) -> None:
    session.execute(
        update(MilvusCollection)
        .where(MilvusCollection.collection_id == collection_id, MilvusCollection.building == name)
        .values(building=None, build_started_at=None, updated_at=now())
    )


def advance(session: Session, collection_id: str, name: str, old: int, new: int) -> bool:
    """Move the watermark of `name` from `old` to `new`. False when the row has moved on
    (another writer advanced it, or a rebuild swapped another collection in)."""
    result = session.execute(
        update(MilvusCollection)
        .where(
            MilvusCollection.collection_id == collection_id,
            MilvusCollection.name == name,
            MilvusCollection.watermark == old,
        )
        .values(watermark=new, updated_at=now())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def remove(session: Session, collection_id: str) -> Binding | None:
    """Forget the collection's binding; returns it (its Milvus collections are the caller's
    to drop)."""
    row = session.get(MilvusCollection, collection_id, with_for_update=True)
    if row is None:
        return None
    binding = _binding(row)
    session.execute(delete(MilvusCollection).where(MilvusCollection.collection_id == collection_id))
    return binding


def orphans(session: Session) -> list[Binding]:
    """Bindings whose collection is deleted or gone: their Milvus collections can go."""
    stmt = (
        select(MilvusCollection)
        .outerjoin(Collection, Collection.id == MilvusCollection.collection_id)
        .where((Collection.id.is_(None)) | (Collection.deleted_at.is_not(None)))
    )
    return [_binding(row) for row in session.scalars(stmt)]


# ---------------------------------------------------------------------------- one writer


def _lock_key(collection_id: str) -> int:
    digest = hashlib.sha256(b"ragserve-milvus-writer:" + collection_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass
class Writer:
    """The right to apply the change log to one collection's Milvus copy, for the length of
    the `writer()` block. `binding` is read under the lock."""

    held: bool
    binding: Binding | None
    _session: Session

    def advance(self, name: str, old: int, new: int) -> bool:
        return advance(self._session, self.binding_id, name, old, new)

    def swap(self, name: str, params: dict[str, Any], watermark: int) -> str | None:
        return finish_build(self._session, self.binding_id, name, params, watermark)

    @property
    def binding_id(self) -> str:
        assert self.binding is not None
        return self.binding.collection_id


_LOCAL = threading.Lock()
_LOCAL_LOCKS: dict[tuple[str, str], threading.Lock] = {}


def _local_lock(db: Database, collection_id: str) -> threading.Lock:
    with _LOCAL:
        return _LOCAL_LOCKS.setdefault((db.describe(), collection_id), threading.Lock())


@contextmanager
def writer(db: Database, collection_id: str, *, wait: bool) -> Iterator[Writer]:
    """Become the collection's one writer for this block, or learn that another process is
    (`held` False, when `wait` is False). The watermark moves in the block's transaction."""
    if db.dialect == "postgresql":
        with db.write() as session:
            fn = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
            got = session.execute(text(f"SELECT {fn}(:k)"), {"k": _lock_key(collection_id)})
            held = True if wait else bool(got.scalar())
            binding = get(session, collection_id) if held else None
            yield Writer(held, binding, session)
        return
    lock = _local_lock(db, collection_id)
    if not lock.acquire(blocking=wait):
        with db.read() as session:
            yield Writer(False, None, session)
        return
    try:
        with db.write() as session:
            binding = get(session, collection_id)
        # SQLite: the Milvus calls run outside a write transaction (holding SQLite's one
        # write lock through them would stall every upload); the watermark moves in a short
        # transaction of its own, compare-and-set.
        with _short_writes(db) as session:
            yield Writer(True, binding, session)
    finally:
        lock.release()


@contextmanager
def _short_writes(db: Database) -> Iterator[Session]:
    """A session whose writes are committed when the block ends, opened lazily: on SQLite
    the write lock is taken only for the final update."""
    session = Session(db.engine.execution_options(sqlite_begin="IMMEDIATE"))
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
