"""An upload racing DELETE /v1/collections/{id}: whichever commits first, no live document is
left in a tombstoned collection (the purge erases only what the delete tombstoned, so such a
document would never be erased). SQLite serialises the two (BEGIN IMMEDIATE); PostgreSQL
orders them on the collection row's lock."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from sqlalchemy import select

from rag import quota
from rag.db import Database, collections
from rag.db.models import Collection, Document, Tenant
from rag.errors import NotFound
from rag.upload.accept import Incoming, accept

WAIT_S = 0.5  # long enough for the other transaction to reach its lock


def _collection(db: Database) -> tuple[str, str]:
    with db.write() as s:
        tenant = Tenant(name="t")
        s.add(tenant)
        s.flush()
        c = collections.create(
            s, tenant.id, name="c", embedding_model="hash-384", embedding_dim=384,
            chunk_tokens=64, chunk_overlap=8, index_kind="auto", index_params={},
            search_defaults={},
        )  # fmt: skip
        return tenant.id, c.id


def _upload(db: Database, tenant_id: str, cid: str) -> str:
    incoming = [Incoming("a.txt", b"raced bytes", "text/plain", {})]
    return accept(db, tenant_id, cid, incoming, max_attempts=3)[0].document.id


def _live_documents_of_tombstoned(db: Database, cid: str) -> list[str]:
    with db.read() as s:
        assert s.get(Collection, cid).deleted_at is not None  # type: ignore[union-attr]
        return list(
            s.scalars(
                select(Document.id).where(
                    Document.collection_id == cid, Document.deleted_at.is_(None)
                )
            )
        )


def test_an_upload_after_the_delete_took_its_lock_finds_no_collection(db: Database) -> None:
    """The upload read the collection live before the delete committed, then inserted its
    document after: a live document in a tombstoned collection. The upload now locks the
    row and reads the tombstone under that lock."""
    tenant_id, cid = _collection(db)
    with ThreadPoolExecutor(1) as pool:
        with db.write() as s:
            collections.delete(s, tenant_id, cid)  # holds the row's lock until commit
            upload: Future[str] = pool.submit(_upload, db, tenant_id, cid)
            threading.Event().wait(WAIT_S)
            assert not upload.done()  # waits for the delete
        with pytest.raises(NotFound):
            upload.result(30)
    assert _live_documents_of_tombstoned(db, cid) == []


def test_a_delete_after_the_upload_took_its_lock_tombstones_the_upload(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant_id, cid = _collection(db)
    inside, release = threading.Event(), threading.Event()
    real = quota.check_upload

    def held(*args: object, **kwargs: object) -> None:  # the upload's last step, uncommitted
        real(*args, **kwargs)  # type: ignore[arg-type]
        inside.set()
        release.wait(30)

    monkeypatch.setattr(quota, "check_upload", held)

    def delete() -> None:
        with db.write() as s:
            collections.delete(s, tenant_id, cid)

    with ThreadPoolExecutor(2) as pool:
        upload = pool.submit(_upload, db, tenant_id, cid)
        assert inside.wait(30)
        deleting = pool.submit(delete)
        threading.Event().wait(WAIT_S)
        assert not deleting.done()  # waits for the upload
        release.set()
        doc_id = upload.result(30)
        deleting.result(30)
    assert _live_documents_of_tombstoned(db, cid) == []
    with db.read() as s:
        assert s.get(Document, doc_id).status == "deleted"  # type: ignore[union-attr]
