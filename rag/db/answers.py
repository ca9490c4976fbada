"""Answers as they were given, their feedback, and their erasure (rag.quality).

An answer is visible to its tenant only, and only within the retention (an expired answer is
a 404 until the purge erases it). It is erased with its collection, with any document it
retrieved, with the stored conversation it was a turn of, and after
`quality.retention_days` (rag.db.purge calls `erase_*` and `expire`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, case, cast, delete, func, select
from sqlalchemy.orm import Session

from rag.db.models import (
    Answer,
    AnswerDocument,
    Collection,
    Conversation,
    Document,
    DriftState,
    DriftWindow,
    Feedback,
    now,
)


@dataclass(frozen=True)
class NewAnswer:
    """One answer to write (rag.quality.record builds it off the answer's path)."""

    id: str
    tenant_id: str
    collection_id: str
    created_at: float
    question: str | None
    question_embedding: bytes | None
    answer: str
    chunk_ids: list[int]
    document_ids: list[str]
    settings: dict[str, Any]
    answer_source: str
    finish_reason: str
    mode: str
    top_score: float | None
    score_gap: float | None
    unsupported: int
    first_token_ms: float | None
    latency_ms: float
    weak: bool
    conversation_id: str | None = None  # the stored conversation it is a turn of


def insert(session: Session, records: Sequence[NewAnswer]) -> int:
    """Write the answers of collections still live; how many. Each collection's row is held
    shared (PostgreSQL: FOR KEY SHARE) until commit, so a delete waits for the write and its
    purge then finds the answers; an answer of a collection deleted first is not written."""
    cids = sorted({r.collection_id for r in records})
    live = set(
        session.scalars(
            select(Collection.id)
            .where(Collection.id.in_(cids), Collection.deleted_at.is_(None))
            .with_for_update(read=True, key_share=True)
        )
    ) if cids else set()  # fmt: skip
    # Likewise the documents each retrieved (FOR SHARE: a delete's tombstone waits): an
    # answer that retrieved a document deleted first is not written at all.
    doc_ids = sorted({d for r in records if r.collection_id in live for d in r.document_ids})
    live_docs: set[str] = set()
    for start in range(0, len(doc_ids), 500):
        live_docs.update(
            session.scalars(
                select(Document.id)
                .where(Document.id.in_(doc_ids[start : start + 500]), Document.deleted_at.is_(None))
                .with_for_update(read=True)
            )
        )
    # And the conversation each was a turn of: one deleted first takes the answer with it.
    conv_ids = sorted({r.conversation_id for r in records if r.conversation_id is not None})
    live_convs = set(
        session.scalars(
            select(Conversation.id)
            .where(Conversation.id.in_(conv_ids), Conversation.deleted_at.is_(None))
            .with_for_update(read=True, key_share=True)
        )
    ) if conv_ids else set()  # fmt: skip
    records = [
        r
        for r in records
        if r.collection_id in live
        and live_docs.issuperset(r.document_ids)
        and (r.conversation_id is None or r.conversation_id in live_convs)
    ]
    if not records:
        return 0
    session.execute(
        Answer.__table__.insert(),  # type: ignore[attr-defined]
        [
            {
                "id": r.id,
                "tenant_id": r.tenant_id,
                "collection_id": r.collection_id,
                "conversation_id": r.conversation_id,
                "created_at": r.created_at,
                "question": r.question,
                "question_embedding": r.question_embedding,
                "answer": r.answer,
                "chunk_ids": r.chunk_ids,
                "settings": r.settings,
                "answer_source": r.answer_source,
                "finish_reason": r.finish_reason,
                "mode": r.mode,
                "top_score": r.top_score,
                "score_gap": r.score_gap,
                "unsupported": r.unsupported,
                "first_token_ms": r.first_token_ms,
                "latency_ms": r.latency_ms,
                "weak": r.weak,
            }  # fmt: skip
            for r in records
        ],
    )
    links = [
        {"answer_id": r.id, "document_id": d}
        for r in records
        for d in dict.fromkeys(r.document_ids)
    ]
    if links:
        session.execute(AnswerDocument.__table__.insert(), links)  # type: ignore[attr-defined]
    return len(records)


def get(session: Session, tenant_id: str, answer_id: str, *, newer_than: float) -> Answer | None:
    """The tenant's answer, if it exists and was given after `newer_than` (the retention)."""
    return session.scalar(
        select(Answer).where(
            Answer.id == answer_id, Answer.tenant_id == tenant_id, Answer.created_at > newer_than
        )
    )


def rate(
    session: Session,
    answer: Answer,
    key_id: str,
    rating: str,
    comment: str | None,
    correct_answer: str | None,
    correct_document_id: str | None,
) -> Feedback:
    """One rating per answer and key: a later one replaces the earlier."""
    session.execute(
        delete(Feedback).where(Feedback.answer_id == answer.id, Feedback.key_id == key_id)
    )
    row = Feedback(
        answer_id=answer.id, key_id=key_id, tenant_id=answer.tenant_id,
        collection_id=answer.collection_id, rating=rating, comment=comment,
        correct_answer=correct_answer, correct_document_id=correct_document_id, created_at=now(),
    )  # fmt: skip
    session.add(row)
    session.flush()
    return row


def rated_by(session: Session, answer_id: str, key_id: str) -> list[Feedback]:
    return list(
        session.scalars(
            select(Feedback).where(Feedback.answer_id == answer_id, Feedback.key_id == key_id)
        )
    )


# ---------------------------------------------------------------- series


def _bucket(created_at: Any, since: float, width_s: float) -> Any:
    """Which `width_s`-wide bucket after `since` a time falls in: bucket i holds
    [since + i * width_s, since + (i + 1) * width_s). Floored before the cast, as PostgreSQL's
    cast to integer rounds where SQLite's truncates."""
    return cast(func.floor((created_at - since) / width_s), Integer).label("bucket")


def series(
    session: Session, collection_id: str, since: float, width_s: float
) -> list[dict[str, Any]]:
    """Answers of a collection since `since`, in buckets of `width_s` seconds: counts by
    answer_source and finish_reason, unsupported sentences, mean top score and gap, mean
    first-token and answer latency."""
    bucket = _bucket(Answer.created_at, since, width_s)
    where = (Answer.collection_id == collection_id, Answer.created_at >= since)
    rows = session.execute(
        select(
            bucket,
            Answer.answer_source,
            Answer.finish_reason,
            func.count(),
            func.sum(Answer.unsupported),
            func.avg(Answer.top_score),
            func.avg(Answer.score_gap),
            func.avg(Answer.first_token_ms),
            func.avg(Answer.latency_ms),
            func.sum(case((Answer.weak, 1), else_=0)),
        )
        .where(*where)
        .group_by(bucket, Answer.answer_source, Answer.finish_reason)
    ).all()
    return [
        {
            "bucket": int(b),
            "answer_source": src,
            "finish_reason": fin,
            "count": int(n),
            "unsupported": int(uns or 0),
            "top_score": top,
            "score_gap": gap,
            "first_token_ms": ft,
            "latency_ms": lat,
            "weak": int(weak or 0),
        }  # fmt: skip
        for b, src, fin, n, uns, top, gap, ft, lat, weak in rows
    ]


def feedback_series(
    session: Session, collection_id: str, since: float, width_s: float
) -> list[tuple[int, str, int]]:
    """(bucket, rating, count) of a collection's feedback since `since`."""
    bucket = _bucket(Feedback.created_at, since, width_s)
    rows = session.execute(
        select(bucket, Feedback.rating, func.count())
        .where(Feedback.collection_id == collection_id, Feedback.created_at >= since)
        .group_by(bucket, Feedback.rating)
    ).all()
    return [(int(b), str(r), int(n)) for b, r, n in rows]


def feedback_counts(session: Session) -> dict[tuple[str, str], int]:
    """(collection, rating) -> ratings held, for /metrics."""
    rows = session.execute(
        select(Feedback.collection_id, Feedback.rating, func.count()).group_by(
            Feedback.collection_id, Feedback.rating
        )
    ).all()
    return {(c, r): int(n) for c, r, n in rows}


# ---------------------------------------------------------------- drift's inputs


def newest(session: Session) -> dict[str, tuple[float, str]]:
    """collection -> (the newest answer's time, its tenant), for collections with answers."""
    rows = session.execute(
        select(Answer.collection_id, func.max(Answer.created_at), func.min(Answer.tenant_id))
        .group_by(Answer.collection_id)
    ).all()  # fmt: skip
    return {c: (float(t), str(tenant)) for c, t, tenant in rows}


def count_after(session: Session, collection_id: str, after: float) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Answer)
            .where(Answer.collection_id == collection_id, Answer.created_at > after)
        )
        or 0
    )


@dataclass(frozen=True)
class Asked:
    """A question as drift and topics read it: no text unless asked for."""

    id: str
    created_at: float
    embedding: bytes
    top_score: float | None
    refused: bool
    question: str | None = None


def recent(session: Session, collection_id: str, n: int, *, oldest_first: bool = False) -> list[
    Asked
]:  # fmt: skip
    """The newest `n` questions with an embedding (or the first `n`, `oldest_first`)."""
    order = Answer.created_at.asc() if oldest_first else Answer.created_at.desc()
    rows = session.execute(
        select(
            Answer.id, Answer.created_at, Answer.question_embedding, Answer.top_score,
            Answer.answer_source,
        )
        .where(Answer.collection_id == collection_id, Answer.question_embedding.is_not(None))
        .order_by(order, Answer.id)
        .limit(n)
    ).all()  # fmt: skip
    return [Asked(i, float(t), bytes(e or b""), s, src == "refused") for i, t, e, s, src in rows]


def weak(session: Session, collection_id: str, since: float, limit: int) -> list[Asked]:
    """The newest `limit` refused or weak-evidence questions since `since`, with text."""
    rows = session.execute(
        select(
            Answer.id, Answer.created_at, Answer.question_embedding, Answer.top_score,
            Answer.answer_source, Answer.question,
        )
        .where(
            Answer.collection_id == collection_id, Answer.created_at >= since, Answer.weak,
            Answer.question_embedding.is_not(None),
        )
        .order_by(Answer.created_at.desc(), Answer.id)
        .limit(limit)
    ).all()  # fmt: skip
    return [
        Asked(i, float(t), bytes(e or b""), s, src == "refused", q) for i, t, e, s, src, q in rows
    ]


def documents_of(session: Session, answer_ids: Iterable[str]) -> dict[str, list[str]]:
    """answer id -> the documents it retrieved."""
    ids = list(answer_ids)
    out: dict[str, list[str]] = {}
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(AnswerDocument.answer_id, AnswerDocument.document_id).where(
                AnswerDocument.answer_id.in_(ids[start : start + 500])
            )
        )
        for a, d in rows:
            out.setdefault(a, []).append(d)
    return out


def rated(session: Session, collection_id: str) -> list[tuple[Answer, Feedback]]:
    """Rated answers of a collection, with every rating (oldest first)."""
    rows = session.execute(
        select(Answer, Feedback)
        .join(Feedback, Feedback.answer_id == Answer.id)
        .where(Answer.collection_id == collection_id)
        .order_by(Feedback.created_at, Answer.id)
    ).all()
    return [(a, f) for a, f in rows]


# ---------------------------------------------------------------- erasure


def erase_answers(session: Session, answer_ids: Sequence[str]) -> int:
    """Erase answers with their feedback, links and reference-window rows."""
    ids = list(answer_ids)
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        session.execute(delete(DriftWindow).where(DriftWindow.answer_id.in_(part)))
        session.execute(delete(Feedback).where(Feedback.answer_id.in_(part)))
        session.execute(delete(AnswerDocument).where(AnswerDocument.answer_id.in_(part)))
        session.execute(delete(Answer).where(Answer.id.in_(part)))
    return len(ids)


def erase_for_documents(session: Session, document_ids: Sequence[str]) -> int:
    """Erase every answer that retrieved any of these documents."""
    if not document_ids:
        return 0
    ids = list(
        session.scalars(
            select(AnswerDocument.answer_id)
            .where(AnswerDocument.document_id.in_(list(document_ids)))
            .distinct()
        )
    )
    return erase_answers(session, ids)


def erase_for_conversations(session: Session, conversation_ids: Sequence[str]) -> int:
    """Erase every answer given as a turn of these conversations."""
    if not conversation_ids:
        return 0
    ids = list(
        session.scalars(select(Answer.id).where(Answer.conversation_id.in_(list(conversation_ids))))
    )
    return erase_answers(session, ids)


def erase_collections(session: Session, collection_ids: Sequence[str]) -> None:
    """Everything quality kept of these collections: answers, feedback, windows, state."""
    cids = list(collection_ids)
    if not cids:
        return
    answers = select(Answer.id).where(Answer.collection_id.in_(cids))
    session.execute(delete(Feedback).where(Feedback.collection_id.in_(cids)))
    session.execute(delete(AnswerDocument).where(AnswerDocument.answer_id.in_(answers)))
    session.execute(delete(Answer).where(Answer.collection_id.in_(cids)))
    session.execute(delete(DriftWindow).where(DriftWindow.collection_id.in_(cids)))
    session.execute(delete(DriftState).where(DriftState.collection_id.in_(cids)))


def expire(session: Session, before: float, limit: int) -> int:
    """Erase up to `limit` answers given before `before` (the retention); the reference
    windows keep their embeddings (no text)."""
    ids = list(
        session.scalars(
            select(Answer.id).where(Answer.created_at < before).order_by(Answer.id).limit(limit)
        )
    )
    if not ids:
        return 0
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        session.execute(delete(Feedback).where(Feedback.answer_id.in_(part)))
        session.execute(delete(AnswerDocument).where(AnswerDocument.answer_id.in_(part)))
        session.execute(delete(Answer).where(Answer.id.in_(part)))
    return len(ids)
