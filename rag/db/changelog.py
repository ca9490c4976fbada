"""The change log the vector indexes catch up from: seq > an index's watermark, in order."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from rag.db.models import ChangeLog, Chunk

# The probe runs before every search: a prebuilt statement on a bare connection costs a
# fraction of an ORM session's round trip when (as usual) nothing is new.
_CHANGES_AFTER = (
    select(ChangeLog.seq, ChangeLog.op, ChangeLog.chunk_id)
    .where(ChangeLog.collection_id == bindparam("cid"), ChangeLog.seq > bindparam("mark"))
    .order_by(ChangeLog.seq)
    .limit(bindparam("n"))
)


def changes_after(
    conn: Connection, collection_id: str, watermark: int, limit: int
) -> list[tuple[int, str, int]]:
    """Up to `limit` changes after `watermark`, oldest first: (seq, op, chunk id)."""
    rows = conn.execute(_CHANGES_AFTER, {"cid": collection_id, "mark": watermark, "n": limit})
    return [(int(seq), str(op), int(chunk_id)) for seq, op, chunk_id in rows]


def head(session: Session, collection_id: str) -> int:
    """The newest seq of the collection (0 when it has none)."""
    stmt = select(func.max(ChangeLog.seq)).where(ChangeLog.collection_id == collection_id)
    return int(session.scalar(stmt) or 0)


def count_after(session: Session, collection_id: str, watermark: int) -> int:
    stmt = (
        select(func.count())
        .select_from(ChangeLog)
        .where(ChangeLog.collection_id == collection_id, ChangeLog.seq > watermark)
    )
    return int(session.scalar(stmt) or 0)


def removals_after(conn: Connection, watermark: int, limit: int) -> list[tuple[int, str, str, int]]:
    """Up to `limit` "remove" entries of any collection after `watermark`, oldest first:
    (seq, collection id, document id, chunk id). What each process tails to drop whatever it
    derived from a chunk that left the record."""
    rows = conn.execute(
        select(ChangeLog.seq, ChangeLog.collection_id, ChangeLog.document_id, ChangeLog.chunk_id)
        .where(ChangeLog.seq > watermark, ChangeLog.op == "remove")
        .order_by(ChangeLog.seq)
        .limit(limit)
    )
    return [(int(seq), str(c), str(d), int(chunk)) for seq, c, d, chunk in rows]


def last_seq(conn: Connection) -> int:
    """The newest seq of any collection (0 when the log is empty)."""
    return int(conn.execute(select(func.max(ChangeLog.seq))).scalar() or 0)


def removed_between(conn: Connection, collection_id: str, after: int, upto: int) -> list[int]:
    """Chunk ids of the collection's "remove" entries with after < seq <= upto."""
    rows = conn.execute(
        select(ChangeLog.chunk_id).where(
            ChangeLog.collection_id == collection_id,
            ChangeLog.seq > after,
            ChangeLog.seq <= upto,
            ChangeLog.op == "remove",
        )
    )
    return [int(chunk_id) for (chunk_id,) in rows]


def last_removal_after(session: Session, collection_id: str, watermark: int) -> int:
    """The seq of the collection's newest "remove" entry after `watermark` (0 when none): a
    snapshot whose watermark is older than it may still hold that chunk's vector."""
    stmt = select(func.max(ChangeLog.seq)).where(
        ChangeLog.collection_id == collection_id,
        ChangeLog.seq > watermark,
        ChangeLog.op == "remove",
    )
    return int(session.scalar(stmt) or 0)


def collections_with_reused_ids(session: Session) -> list[str]:
    """Collections holding a chunk whose id a "remove" entry already names: SQLite handed
    purged ids out again before migration 0008, and the index purge may have erased the new
    chunk's vector. Their indexes are checked against SQL at start-up."""
    stmt = (
        select(ChangeLog.collection_id)
        .join(Chunk, Chunk.id == ChangeLog.chunk_id)
        .where(ChangeLog.op == "remove", Chunk.document_id != ChangeLog.document_id)
        .distinct()
    )
    return sorted(str(c) for c in session.scalars(stmt))
