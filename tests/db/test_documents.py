"""Documents (rag.db.documents): an upload's blob, document and job; duplicates; keyset
pages that neither skip nor repeat a row; tenant-scoped reads; the delete's tombstone."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from rag.db import Database, documents, jobs
from rag.db.models import Blob, ChangeLog, Document, IngestJob
from rag.errors import Invalid, NotFound
from tests.db.conftest import Make


def _blobs(db: Database) -> list[tuple[str, str]]:
    with db.read() as s:
        return sorted((t, sha) for t, sha in s.execute(select(Blob.tenant_id, Blob.sha256)))


def test_an_upload_writes_its_document_and_job_and_the_same_bytes_are_one_document(
    db: Database, make: Make
) -> None:
    tenant = make.tenant()
    cid, other_cid = make.collection(tenant), make.collection(tenant)
    first = make.upload(cid, b"same bytes", filename="a.txt", meta={"k": 1})
    assert not first.duplicate and first.job is not None
    assert (first.document.status, first.document.size, first.document.meta) == (
        "queued", 10, {"k": 1}
    )  # fmt: skip
    assert (first.job.state, first.job.document_id, first.job.tenant_id) == (
        "queued", first.document.id, tenant
    )  # fmt: skip

    again = make.upload(cid, b"same bytes", filename="b.txt")
    assert again.duplicate and not again.requeued
    assert again.document.id == first.document.id
    assert again.job is not None and again.job.id == first.job.id

    elsewhere = make.upload(other_cid, b"same bytes")
    assert not elsewhere.duplicate and elsewhere.document.id != first.document.id
    stranger = make.upload(make.collection(make.tenant()), b"same bytes")
    assert not stranger.duplicate
    # One copy of the bytes per tenant, shared by that tenant's documents.
    blobs = _blobs(db)
    assert len(blobs) == 2 and {t for t, _ in blobs} == {tenant, stranger.document.tenant_id}
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(IngestJob)) == 3


def test_a_failed_document_uploaded_again_is_queued_again_with_a_new_job(
    db: Database, make: Make
) -> None:
    cid = make.collection(make.tenant())
    first = make.upload(cid, b"broken", max_attempts=1)
    held = jobs.claim(db, "w", 60)
    assert held is not None
    jobs.fail(db, held, "bad", permanent=True, backoff_base_s=1, backoff_max_s=1)

    again = make.upload(cid, b"broken", max_attempts=4)
    assert again.duplicate and again.requeued
    assert again.document.id == first.document.id
    assert again.job is not None and first.job is not None and again.job.id != first.job.id
    assert (again.job.state, again.job.max_attempts) == ("queued", 4)
    with db.read() as s:
        doc = s.get(Document, first.document.id)
        assert doc is not None and (doc.status, doc.error) == ("queued", None)

    third = make.upload(cid, b"broken")  # queued now: returned as it is
    assert third.duplicate and not third.requeued and third.job is not None
    assert third.job.id == again.job.id


def test_pages_of_documents_neither_skip_nor_repeat_a_row(db: Database, make: Make) -> None:
    tenant, cid = make.tenant_and_collection()
    ids = [make.upload(cid).document.id for _ in range(7)]
    make.set_created(ids[2:6], 1000.0)  # ties broken by id
    make.upload(make.collection(tenant))  # another collection's
    make.upload(make.collection(make.tenant()))  # another tenant's

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        with db.read() as s:
            page, cursor = documents.list_page(s, tenant, cid, limit=2, cursor=cursor)
        seen += [d.id for d in page]
        pages += 1
        if cursor is None:
            break
    assert pages == 4
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
    with db.read() as s:
        everything, last = documents.list_page(s, tenant, cid, limit=7)
    assert last is None and [d.id for d in everything] == seen


def test_a_listing_shows_live_documents_of_the_tenants_own_collection_only(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid = make.collection(tenant)
    kept = make.upload(cid).document.id
    gone = make.upload(cid).document.id
    indexed = make.indexed(cid, ["an indexed passage"]).document_id
    with db.write() as s:
        documents.delete(s, tenant, gone)

    with db.read() as s:
        page, _ = documents.list_page(s, tenant, cid, limit=10)
        assert sorted(d.id for d in page) == sorted([kept, indexed])
        page, _ = documents.list_page(s, tenant, cid, limit=10, status="indexed")
        assert [d.id for d in page] == [indexed]
        with pytest.raises(NotFound):
            documents.list_page(s, stranger, cid, limit=10)
        with pytest.raises(Invalid):
            documents.list_page(s, tenant, cid, limit=10, cursor="not a cursor")


def test_get_answers_not_found_for_another_tenants_or_a_deleted_document(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid = make.collection(tenant)
    doc_id = make.upload(cid, filename="report.pdf").document.id
    with db.read() as s:
        assert documents.get(s, tenant, doc_id).filename == "report.pdf"
        with pytest.raises(NotFound):
            documents.get(s, stranger, doc_id)
        assert documents.filenames(s, tenant, [doc_id, "nope"]) == {doc_id: "report.pdf"}
        assert documents.filenames(s, stranger, [doc_id]) == {}
    with db.write() as s:
        with pytest.raises(NotFound):
            documents.delete(s, stranger, doc_id)
        documents.delete(s, tenant, doc_id)
    with db.read() as s, pytest.raises(NotFound):
        documents.get(s, tenant, doc_id)


def test_a_delete_tombstones_logs_a_remove_per_chunk_and_cancels_the_job(
    db: Database, make: Make
) -> None:
    tenant, cid = make.tenant_and_collection()
    seeded = make.indexed(cid, ["one", "two", "three"])
    queued = make.upload(cid, b"queued bytes")
    with db.write() as s:
        doc = documents.delete(s, tenant, seeded.document_id)
        assert (doc.status, doc.deleted_at is not None) == ("deleted", True)
        documents.delete(s, tenant, queued.document.id)

    with db.read() as s:
        removes = s.execute(
            select(ChangeLog.chunk_id, ChangeLog.document_id, ChangeLog.collection_id).where(
                ChangeLog.op == "remove"
            )
        ).all()
        assert sorted(r[0] for r in removes) == sorted(seeded.chunk_ids)
        assert {(r[1], r[2]) for r in removes} == {(seeded.document_id, cid)}
        assert queued.job is not None
        job = s.get(IngestJob, queued.job.id)
        assert job is not None and (job.state, job.error) == ("cancelled", "document deleted")
    # The same bytes may be uploaded again: the tombstone holds no place.
    assert not make.upload(cid, b"queued bytes").duplicate


def test_corpus_names_use_the_metadata_id_else_the_filename_and_its_stem(
    db: Database, make: Make
) -> None:
    cid = make.collection(make.tenant())
    named = make.upload(cid, filename="notes.md").document.id
    by_id = make.upload(cid, filename="x.txt", meta={"_id": 42}).document.id
    with db.read() as s:
        assert documents.corpus_names(s, cid) == {named: {"notes.md", "notes"}, by_id: {"42"}}
