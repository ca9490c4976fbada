"""Drift windows and state (rag.quality.drift): in SQL, so replicas agree and a restart loses
nothing. A test's result is written only if no process wrote a newer one meanwhile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from rag.db.answers import Asked
from rag.db.models import Chunk, Document, DriftState, DriftWindow, now

KINDS = ("questions", "content")


def reference(session: Session, collection_id: str) -> list[Asked]:
    rows = session.execute(
        select(
            DriftWindow.answer_id, DriftWindow.asked_at, DriftWindow.embedding,
            DriftWindow.top_score, DriftWindow.refused,
        )
        .where(DriftWindow.collection_id == collection_id)
        .order_by(DriftWindow.asked_at, DriftWindow.answer_id)
    ).all()  # fmt: skip
    return [Asked(a, float(t), bytes(e), s, bool(r)) for a, t, e, s, r in rows]


def set_reference(session: Session, collection_id: str, rows: Sequence[Asked]) -> None:
    session.execute(delete(DriftWindow).where(DriftWindow.collection_id == collection_id))
    if rows:
        session.execute(
            DriftWindow.__table__.insert(),  # type: ignore[attr-defined]
            [
                {
                    "collection_id": collection_id,
                    "answer_id": r.id,
                    "embedding": r.embedding,
                    "top_score": r.top_score,
                    "refused": r.refused,
                    "asked_at": r.created_at,
                }  # fmt: skip
                for r in rows
            ],
        )


def state(session: Session, collection_id: str, kind: str, *, lock: bool = False) -> (
    DriftState | None
):  # fmt: skip
    stmt = select(DriftState).where(
        DriftState.collection_id == collection_id, DriftState.kind == kind
    )
    if lock:
        stmt = stmt.with_for_update()
    return session.scalar(stmt)


def states(session: Session, tenant_id: str | None = None) -> list[DriftState]:
    stmt = select(DriftState).order_by(DriftState.collection_id, DriftState.kind)
    if tenant_id is not None:
        stmt = stmt.where(DriftState.tenant_id == tenant_id)
    return list(session.scalars(stmt))


def save(
    session: Session, collection_id: str, kind: str, tenant_id: str, *, expect_mark: int,
    **values: Any,
) -> bool:  # fmt: skip
    """Write a test's result when the state's mark is still `expect_mark` (as read before
    the test): False when another process tested the same answers first."""
    row = state(session, collection_id, kind, lock=True)
    if row is None:
        if expect_mark != 0:
            return False  # erased meanwhile (the collection's purge)
        row = DriftState(collection_id=collection_id, kind=kind, tenant_id=tenant_id)
        session.add(row)
    elif row.mark != expect_mark:
        return False
    for name, value in values.items():
        setattr(row, name, value)
    row.updated_at = now()
    session.flush()
    return True


def pin(session: Session, collection_id: str, tenant_id: str, pinned: bool) -> None:
    row = state(session, collection_id, "questions", lock=True)
    if row is None:
        row = DriftState(
            collection_id=collection_id, kind="questions", tenant_id=tenant_id, score=0.0,
            statistic=0.0, threshold=0.0, alert=False, streak=0, mark=0, details={},
        )  # fmt: skip
        session.add(row)
    row.pinned = pinned
    row.streak = 0
    row.alert = False
    row.updated_at = now()


# ---------------------------------------------------------------- content drift's inputs


def indexed_since(session: Session) -> dict[str, tuple[float, str]]:
    """collection -> (the newest indexed time of its live documents, its tenant)."""
    rows = session.execute(
        select(Document.collection_id, func.max(Document.indexed_at), func.min(Document.tenant_id))
        .where(Document.deleted_at.is_(None), Document.status == "indexed")
        .group_by(Document.collection_id)
    ).all()
    return {c: (float(t), str(tenant)) for c, t, tenant in rows if t is not None}


def document_vectors(
    session: Session, collection_id: str, *, after: float | None, upto: float | None,
    limit: int, per_document: int = 8,
) -> dict[str, list[bytes]]:  # fmt: skip
    """document -> the embeddings of its first `per_document` chunks, for up to `limit`
    live documents indexed in (after, upto], newest first."""
    where = [
        Document.collection_id == collection_id,
        Document.deleted_at.is_(None),
        Document.status == "indexed",
    ]
    if after is not None:
        where.append(Document.indexed_at > after)
    if upto is not None:
        where.append(Document.indexed_at <= upto)
    doc_ids = list(
        session.scalars(
            select(Document.id).where(*where).order_by(Document.indexed_at.desc()).limit(limit)
        )
    )
    out: dict[str, list[bytes]] = {}
    for start in range(0, len(doc_ids), 500):
        rows = session.execute(
            select(Chunk.document_id, Chunk.embedding).where(
                Chunk.document_id.in_(doc_ids[start : start + 500]), Chunk.ordinal < per_document
            )
        )
        for d, e in rows:
            out.setdefault(d, []).append(bytes(e))
    return out
