"""The change log the vector indexes catch up from: seq > an index's watermark, in order."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from rag.db.models import ChangeLog

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
