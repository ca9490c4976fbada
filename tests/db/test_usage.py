"""Quota counts (rag.db.usage): what a tenant holds and has pending, its own rows only."""

from __future__ import annotations

from rag.db import Database, collections, documents, jobs, usage
from tests.db.conftest import Make


def test_a_tenants_counts_cover_its_own_live_rows_only(db: Database, make: Make) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid, dropped = make.collection(tenant), make.collection(tenant)
    make.upload(cid, b"x" * 10)
    make.upload(cid, b"y" * 20)
    deleted = make.upload(cid, b"z" * 40)
    make.upload(dropped, b"w" * 80)
    make.indexed(cid, ["an indexed passage"], data=b"i" * 5)
    make.upload(make.collection(stranger), b"s" * 1000)
    with db.write() as s:
        documents.delete(s, tenant, deleted.document.id)
        collections.delete(s, tenant, dropped)

    held = jobs.claim(db, "w", 60)  # one of them running: still pending
    assert held is not None
    with db.write() as s:
        usage.lock_tenant(s, tenant)
        assert usage.collections(s, tenant) == 1
        assert usage.documents(s, tenant) == (3, 10 + 20 + 5)
        assert usage.pending_jobs(s, tenant) == 2  # the deleted ones' jobs were cancelled
        assert usage.collections(s, stranger) == 1
        assert usage.documents(s, stranger) == (1, 1000)
        assert usage.pending_jobs(s, stranger) == 1
