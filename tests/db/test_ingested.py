"""What a finished ingest job writes (rag.db.ingested): chunks, vectors, full text and change
log with the document indexed and the job done, each job fenced on its own lease."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from rag.db import Database, changelog, chunks, documents, fulltext, jobs
from rag.db.ingested import ChunkRow, Finished, chunk_uid, complete, complete_many
from rag.db.jobs import ClaimedJob, LeaseLost
from rag.db.models import Chunk, Document, IngestJob
from tests.db.conftest import DIM, MODEL, Make, unit_vector

ROWS = [ChunkRow(0, "first passage", 0, 13, 2), ChunkRow(1, "second passage", 14, 28, 2)]
VECTORS = np.stack([unit_vector(r.text) for r in ROWS])
TEXT = "first passage second passage"


def _finished(job: ClaimedJob) -> Finished:
    return Finished(job, TEXT, ROWS, VECTORS)


def _claim(db: Database, n: int, lease_s: float = 60.0) -> list[ClaimedJob]:
    return jobs.claim_many(db, "w1", lease_s, n)


def _chunk_count(db: Database, document_id: str) -> int:
    with db.read() as s:
        stmt = select(func.count()).select_from(Chunk).where(Chunk.document_id == document_id)
        return int(s.scalar(stmt) or 0)


def test_a_completed_job_leaves_its_document_indexed_and_searchable(
    db: Database, make: Make
) -> None:
    tenant, cid = make.tenant_and_collection()
    make.upload(cid)
    [job] = _claim(db, 1)
    assert complete(db, job, text=TEXT, chunks=ROWS, vectors=VECTORS, embedding_model=MODEL) == (
        "done"
    )

    with db.read() as s:
        doc = documents.get(s, tenant, job.document_id)
        assert (doc.status, doc.text, doc.chunk_count, doc.error) == ("indexed", TEXT, 2, None)
        assert doc.indexed_at is not None
        row = s.get(IngestJob, job.id)
        assert row is not None and (row.state, row.lease_owner) == ("done", None)
        written = chunks.list_page(s, tenant, job.document_id, limit=10, offset=0)
        assert [(c.text, c.start_char, c.end_char) for c in written] == [
            ("first passage", 0, 13), ("second passage", 14, 28)
        ]  # fmt: skip
        assert [c.uid for c in written] == [chunk_uid(job.document_id, r) for r in ROWS]
        ids, vectors = chunks.vectors_of(s, cid, MODEL, DIM, [c.id for c in written])
        np.testing.assert_array_equal(vectors, VECTORS)
        assert [i for i, _ in fulltext.keyword_search(s, cid, "second", 5)] == [written[1].id]
    with db.connect() as conn:
        log = changelog.changes_after(conn, cid, 0, 10)
    assert [(op, c) for _, op, c in log] == [("add", c.id) for c in written]


def test_a_job_whose_lease_was_lost_writes_nothing(db: Database, make: Make) -> None:
    make.upload(make.collection(make.tenant()))
    [stale] = _claim(db, 1, lease_s=-1.0)
    taken = jobs.claim(db, "w2", 60.0)
    assert taken is not None and taken.id == stale.id

    with pytest.raises(LeaseLost):
        complete(db, stale, text=TEXT, chunks=ROWS, vectors=VECTORS, embedding_model=MODEL)
    assert _chunk_count(db, stale.document_id) == 0
    with db.read() as s:
        doc = s.get(Document, stale.document_id)
        assert doc is not None and doc.status == "parsing"
        row = s.get(IngestJob, stale.id)
        assert row is not None and (row.state, row.lease_owner) == ("running", "w2")


def test_a_batch_writes_each_job_on_its_own_lease(db: Database, make: Make) -> None:
    """A delete cancels the document's job, so its write is dropped like a lost lease's."""
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    kept = make.upload(cid).document.id
    deleted = make.upload(other).document.id
    lost = make.upload(cid).document.id
    held = {j.document_id: j for j in _claim(db, 3)}
    with db.write() as s:
        documents.delete(s, tenant, deleted)
        s.get(IngestJob, held[lost].id).lease_owner = "someone else"  # type: ignore[union-attr]

    states = complete_many(db, [_finished(j) for j in held.values()], MODEL)
    assert states == {held[kept].id: "done", held[deleted].id: "lost", held[lost].id: "lost"}
    assert [_chunk_count(db, d) for d in (kept, deleted, lost)] == [2, 0, 0]
    with db.read() as s:
        statuses = {d: s.get(Document, d).status for d in (kept, deleted, lost)}  # type: ignore[union-attr]
        row = s.get(IngestJob, held[deleted].id)
        assert row is not None and (row.state, row.error) == ("cancelled", "document deleted")
    assert statuses == {kept: "indexed", deleted: "deleted", lost: "parsing"}
