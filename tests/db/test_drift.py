"""Drift windows and state (rag.db.drift): a test's result is written only over the state it
was computed from, and content drift reads the documents indexed in its window."""

from __future__ import annotations

from sqlalchemy import update

from rag.db import Database, documents, drift
from rag.db.answers import Asked
from rag.db.models import Document
from tests.db.conftest import Make, unit_vector


def test_the_reference_window_is_replaced_whole_per_collection(db: Database) -> None:
    rows = [Asked("a2", 2.0, b"v2", 0.5, False), Asked("a1", 1.0, b"v1", None, True)]
    with db.write() as s:
        drift.set_reference(s, "c1", rows)
        drift.set_reference(s, "c2", [Asked("b1", 1.0, b"w", 0.1, False)])
    with db.read() as s:
        assert drift.reference(s, "c1") == [rows[1], rows[0]]  # oldest first
    with db.write() as s:
        drift.set_reference(s, "c1", [rows[0]])
    with db.read() as s:
        assert drift.reference(s, "c1") == [rows[0]]
        assert [a.id for a in drift.reference(s, "c2")] == ["b1"]
    with db.write() as s:
        drift.set_reference(s, "c1", [])
    with db.read() as s:
        assert drift.reference(s, "c1") == []


def test_a_result_is_saved_only_over_the_state_it_was_computed_from(db: Database) -> None:
    with db.write() as s:
        assert drift.save(s, "c1", "questions", "t1", expect_mark=4, mark=9) is False
        assert drift.save(s, "c1", "questions", "t1", expect_mark=0, mark=5, score=1.5) is True
        assert drift.save(s, "c1", "questions", "t1", expect_mark=0, mark=7) is False  # raced
        assert drift.save(s, "c1", "questions", "t1", expect_mark=5, mark=8, streak=2, alert=True)
        drift.save(s, "c2", "content", "t2", expect_mark=0, mark=1)
    with db.read() as s:
        row = drift.state(s, "c1", "questions")
        assert row is not None
        assert (row.mark, row.score, row.streak, row.alert) == (8, 1.5, 2, True)
        assert drift.state(s, "c1", "content") is None
        assert [(r.collection_id, r.kind) for r in drift.states(s)] == [
            ("c1", "questions"), ("c2", "content")
        ]  # fmt: skip
        assert [r.collection_id for r in drift.states(s, "t2")] == ["c2"]

    with db.write() as s:
        drift.pin(s, "c1", "t1", True)
        drift.pin(s, "c3", "t1", True)  # a collection never tested yet
    with db.read() as s:
        row = drift.state(s, "c1", "questions")
        assert row is not None and (row.pinned, row.streak, row.alert, row.mark) == (
            True, 0, False, 8
        )  # fmt: skip
        fresh = drift.state(s, "c3", "questions")
        assert fresh is not None and (fresh.pinned, fresh.mark) == (True, 0)


def test_content_drift_reads_live_documents_indexed_in_its_window(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, empty = make.collection(tenant), make.collection(tenant)
    docs = [make.indexed(cid, [f"d{i} c{j}" for j in range(3)]) for i in range(4)]
    make.upload(empty)  # not indexed: no time to report
    with db.write() as s:
        for i, d in enumerate(docs):
            s.execute(
                update(Document).where(Document.id == d.document_id).values(indexed_at=100.0 + i)
            )
        documents.delete(s, tenant, docs[3].document_id)
    with db.read() as s:
        assert drift.indexed_since(s) == {cid: (102.0, tenant)}
        window = drift.document_vectors(s, cid, after=100.0, upto=102.0, limit=10, per_document=2)
        assert set(window) == {docs[1].document_id, docs[2].document_id}
        got = sorted(window[docs[1].document_id])
        assert got == sorted(unit_vector(f"d1 c{j}").tobytes() for j in range(2))
        newest = drift.document_vectors(s, cid, after=None, upto=None, limit=1)
        assert set(newest) == {docs[2].document_id} and len(newest[docs[2].document_id]) == 3
