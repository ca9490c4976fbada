"""Recorded answers and feedback (rag.db.answers): written only while what they came from is
live, visible to their tenant within the retention, one rating per key, and erased with
whatever they retrieved."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from sqlalchemy import func, select

from rag.db import Database, answers, collections, conversations, documents, drift
from rag.db.answers import Asked, NewAnswer
from rag.db.conversations import Owner
from rag.db.models import Answer, AnswerDocument, DriftState, DriftWindow, Feedback
from tests.db.conftest import Make

T0 = 1_000_000.0


def _answer(
    id: str, tenant: str, cid: str, *docs: str, at: float = T0, **fields: object
) -> NewAnswer:
    values: dict[str, object] = {
        "id": id, "tenant_id": tenant, "collection_id": cid, "created_at": at,
        "question": f"question {id}", "question_embedding": b"\x00" * 16, "answer": "an answer",
        "chunk_ids": [1, 2], "document_ids": list(docs), "settings": {"k": 4},
        "answer_source": "generated", "finish_reason": "stop", "mode": "generate",
        "top_score": 0.8, "score_gap": 0.1, "unsupported": 0, "first_token_ms": 10.0,
        "latency_ms": 100.0, "weak": False,
    }  # fmt: skip
    values.update(fields)
    return NewAnswer(**values)  # type: ignore[arg-type]


def _insert(db: Database, *records: NewAnswer) -> int:
    with db.write() as s:
        return answers.insert(s, records)


def _ids(db: Database) -> set[str]:
    with db.read() as s:
        return set(s.scalars(select(Answer.id)))


def _rate(db: Database, answer_id: str, key: str, rating: str, tenant: str) -> None:
    with db.write() as s:
        row = answers.get(s, tenant, answer_id, newer_than=0)
        assert row is not None
        answers.rate(s, row, key, rating, None, None, None)


def test_an_answer_is_written_only_while_its_sources_are_live(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, dropped = make.collection(tenant), make.collection(tenant)
    live, gone = make.upload(cid).document.id, make.upload(cid).document.id
    owner = Owner(tenant, "k", False)
    with db.write() as s:
        kept_conv = conversations.create(s, owner, cid).id
        gone_conv = conversations.create(s, owner, cid).id
    with db.write() as s:
        documents.delete(s, tenant, gone)
        collections.delete(s, tenant, dropped)
        conversations.delete_one(s, owner, cid, gone_conv)

    written = _insert(
        db,
        _answer("ok", tenant, cid, live, live),
        _answer("no-sources", tenant, cid),
        _answer("in-conv", tenant, cid, live, conversation_id=kept_conv),
        _answer("dropped-collection", tenant, dropped),
        _answer("deleted-document", tenant, cid, live, gone),
        _answer("deleted-conversation", tenant, cid, conversation_id=gone_conv),
    )
    assert written == 3
    assert _ids(db) == {"ok", "no-sources", "in-conv"}
    with db.read() as s:
        assert answers.documents_of(s, ["ok", "no-sources"]) == {"ok": [live]}
    assert _insert(db) == 0


def test_an_answer_is_its_tenants_and_only_within_the_retention(db: Database, make: Make) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid = make.collection(tenant)
    _insert(db, _answer("a1", tenant, cid, at=T0))
    with db.read() as s:
        got = answers.get(s, tenant, "a1", newer_than=T0 - 1)
        assert got is not None and (got.settings, got.chunk_ids) == ({"k": 4}, [1, 2])
        assert answers.get(s, stranger, "a1", newer_than=0) is None
        assert answers.get(s, tenant, "a1", newer_than=T0) is None  # expired


def test_a_keys_later_rating_replaces_its_earlier_one(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    _insert(db, _answer("a1", tenant, cid), _answer("a2", tenant, other))
    _rate(db, "a1", "k1", "up", tenant)
    _rate(db, "a1", "k1", "down", tenant)
    _rate(db, "a1", "k2", "down", tenant)
    _rate(db, "a2", "k1", "up", tenant)

    with db.read() as s:
        assert [f.rating for f in answers.rated_by(s, "a1", "k1")] == ["down"]
        assert answers.feedback_counts(s) == {(cid, "down"): 2, (other, "up"): 1}
        pairs = answers.rated(s, cid)
        assert sorted((a.id, f.key_id, f.rating) for a, f in pairs) == [
            ("a1", "k1", "down"), ("a1", "k2", "down")
        ]  # fmt: skip
        since = time.time() - 60
        assert answers.feedback_series(s, cid, since, 3600) == [(0, "down", 2)]
        assert answers.feedback_series(s, cid, time.time() + 60, 3600) == []


def test_the_series_buckets_a_collections_answers(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    _insert(
        db,
        _answer("old", tenant, cid, at=T0 - 1),
        _answer("b0", tenant, cid, at=T0, top_score=0.6, unsupported=1),
        _answer("b0w", tenant, cid, at=T0 + 20, top_score=0.2, unsupported=2, weak=True),
        _answer("b1", tenant, cid, at=T0 + 70, answer_source="refused", finish_reason="refused"),
        _answer("theirs", tenant, other, at=T0),
    )
    with db.read() as s:
        rows = sorted(answers.series(s, cid, T0, 60), key=lambda r: r["bucket"])
    assert [(r["bucket"], r["answer_source"], r["count"]) for r in rows] == [
        (0, "generated", 2), (1, "refused", 1)
    ]  # fmt: skip
    first = rows[0]
    assert (first["unsupported"], first["weak"]) == (3, 1)
    assert first["top_score"] == pytest.approx(0.4)
    assert first["latency_ms"] == pytest.approx(100.0)


def test_a_bucket_holds_the_whole_of_its_width(db: Database, make: Make) -> None:
    """Bucket i starts at since + i * width (rag.api.routes.quality labels it so)."""
    tenant, cid = make.tenant_and_collection()
    _insert(db, _answer("late", tenant, cid, at=T0 + 45), _answer("rated", tenant, cid))
    _rate(db, "rated", "k", "up", tenant)
    with db.read() as s:
        assert [r["bucket"] for r in answers.series(s, cid, T0, 60)] == [0]
        assert answers.feedback_series(s, cid, time.time() - 45, 60) == [(0, "up", 1)]


def test_drift_reads_the_newest_questions_with_an_embedding(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    _insert(
        db,
        _answer("a1", tenant, cid, at=T0 + 1),
        _answer("a2", tenant, cid, at=T0 + 2, weak=True, answer_source="refused"),
        _answer("a3", tenant, cid, at=T0 + 3),
        _answer("no-vector", tenant, cid, at=T0 + 4, question_embedding=None, weak=True),
        _answer("b1", tenant, other, at=T0 + 9),
    )
    with db.read() as s:
        assert answers.newest(s) == {cid: (T0 + 4, tenant), other: (T0 + 9, tenant)}
        assert answers.count_after(s, cid, T0 + 1) == 3
        assert [a.id for a in answers.recent(s, cid, 2)] == ["a3", "a2"]
        assert [a.id for a in answers.recent(s, cid, 2, oldest_first=True)] == ["a1", "a2"]
        [weak] = answers.weak(s, cid, T0, 10)
        assert weak == Asked("a2", T0 + 2, b"\x00" * 16, 0.8, True, "question a2")
        assert answers.weak(s, cid, T0 + 3, 10) == []


def test_erasure_takes_an_answer_with_its_feedback_links_and_window(
    db: Database, make: Make
) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    doc, kept_doc = make.upload(cid).document.id, make.upload(cid).document.id
    with db.write() as s:
        conv = conversations.create(s, Owner(tenant, "k", False), cid).id
    recent = time.time()
    base = _answer("x", tenant, cid, at=recent)
    _insert(
        db,
        replace(base, id="by-doc", document_ids=[doc, kept_doc]),
        replace(base, id="by-conv", conversation_id=conv),
        replace(base, id="kept", document_ids=[kept_doc]),
        replace(base, id="expired", created_at=T0),
        replace(base, id="theirs", collection_id=other),
    )
    for answer_id in ("by-doc", "kept", "expired", "theirs"):
        _rate(db, answer_id, "k", "up", tenant)
    with db.write() as s:
        window = [Asked(a, recent, b"v", 0.5, False) for a in ("by-doc", "kept", "expired")]
        drift.set_reference(s, cid, window)
        drift.save(s, other, "questions", tenant, expect_mark=0, mark=3)

    with db.write() as s:
        assert answers.erase_for_documents(s, [doc]) == 1
        assert answers.erase_for_documents(s, []) == 0
        assert answers.erase_for_conversations(s, [conv]) == 1
        assert answers.expire(s, recent - 1, 10) == 1
        assert answers.expire(s, recent - 1, 10) == 0
    assert _ids(db) == {"kept", "theirs"}
    with db.read() as s:
        assert {a for (a,) in s.execute(select(Feedback.answer_id))} == {"kept", "theirs"}
        assert {a for (a,) in s.execute(select(AnswerDocument.answer_id))} == {"kept"}
        # The window keeps an expired answer's embedding (no text), not an erased one's.
        assert sorted(a.id for a in drift.reference(s, cid)) == ["expired", "kept"]

    with db.write() as s:
        answers.erase_collections(s, [other])
        answers.erase_collections(s, [])
    assert _ids(db) == {"kept"}
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(DriftState)) == 0
        assert s.scalar(select(func.count()).select_from(DriftWindow)) == 2
