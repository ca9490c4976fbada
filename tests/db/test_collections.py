"""Collections (rag.db.collections, rag.db.locks): names unique among a tenant's live
collections, lookups scoped to the tenant, the delete's tombstone and the counts."""

from __future__ import annotations

import pytest

from rag.db import Database, collections, documents
from rag.db.locks import lock_collection
from rag.db.models import IngestJob
from rag.errors import Conflict, Invalid, NotFound
from tests.db.conftest import Make


def _delete(db: Database, tenant_id: str, collection_id: str) -> None:
    with db.write() as s:
        collections.delete(s, tenant_id, collection_id)


def test_a_name_is_unique_among_a_tenants_live_collections(db: Database, make: Make) -> None:
    tenant = make.tenant()
    first = make.collection(tenant, "docs")
    with pytest.raises(Conflict):
        make.collection(tenant, "docs")
    theirs = make.collection(make.tenant(), "docs")  # another tenant may use it
    _delete(db, tenant, first)
    again = make.collection(tenant, "docs")  # and so may a new one, once the old is deleted
    assert len({first, theirs, again}) == 3


def test_list_live_gives_the_tenants_live_collections_oldest_first(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    ids = [make.collection(tenant, name) for name in ("b", "a", "c")]
    make.collection(stranger, "mine")
    _delete(db, tenant, ids[1])
    with db.read() as s:
        assert [c.id for c in collections.list_live(s, tenant)] == [ids[0], ids[2]]
        assert collections.live_among(s, [*ids, "nope"]) == {ids[0], ids[2]}
        assert collections.live_among(s, []) == set()
        assert set(collections.all_live(s)) == {ids[0], ids[2]} | {
            c.id for c in collections.list_live(s, stranger)
        }


def test_get_answers_not_found_for_another_tenant_or_a_deleted_collection(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid = make.collection(tenant, "docs", search_defaults={"k": 7})
    with db.read() as s:
        assert collections.get(s, tenant, cid).name == "docs"
        with pytest.raises(NotFound):
            collections.get(s, stranger, cid)
    with db.connect() as conn:
        assert collections.saved_defaults(conn, tenant, cid) == {"k": 7}
        assert collections.saved_defaults(conn, stranger, cid) is None
    with db.write() as s, pytest.raises(NotFound):
        collections.delete(s, stranger, cid)

    _delete(db, tenant, cid)
    with db.read() as s:
        with pytest.raises(NotFound):
            collections.get(s, tenant, cid)
        assert collections.get_live(s, cid) is None
        locked = lock_collection(s, cid)  # the lock takes the row whatever its state
        assert locked is not None and locked.deleted_at is not None
        assert lock_collection(s, "nope") is None
    with db.connect() as conn:
        assert collections.saved_defaults(conn, tenant, cid) is None


def test_find_takes_an_id_or_a_name_and_refuses_a_name_two_tenants_use(
    db: Database, make: Make
) -> None:
    a, b = make.tenant("acme"), make.tenant("globex")
    a_docs = make.collection(a, "docs")
    b_docs = make.collection(b, "docs")
    named_like_an_id = make.collection(b, a_docs)
    with db.read() as s:
        assert collections.find(s, "docs", tenant_id=a).id == a_docs  # type: ignore[union-attr]
        assert collections.find(s, "docs", tenant_id=b).id == b_docs  # type: ignore[union-attr]
        with pytest.raises(Invalid):
            collections.find(s, "docs")
        # An id wins over a name, and a tenant's lookup never reaches another's collection.
        assert collections.find(s, a_docs).id == a_docs  # type: ignore[union-attr]
        assert collections.find(s, a_docs, tenant_id=b).id == named_like_an_id  # type: ignore[union-attr]
        assert collections.find(s, b_docs, tenant_id=a) is None
        assert collections.find(s, "nope") is None
        found = collections.find_in_tenant_named(s, "docs", "globex")
        assert found is not None and found.id == b_docs
        assert collections.find_in_tenant_named(s, "docs", "nobody") is None


def test_a_delete_tombstones_the_documents_and_cancels_their_jobs(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, kept = make.collection(tenant), make.collection(tenant)
    queued = make.upload(cid)
    indexed = make.indexed(cid, ["a passage"])
    other = make.upload(kept)
    _delete(db, tenant, cid)

    with db.read() as s:
        with pytest.raises(NotFound):
            documents.get(s, tenant, queued.document.id)
        with pytest.raises(NotFound):
            documents.get(s, tenant, indexed.document_id)
        assert documents.get(s, tenant, other.document.id).status == "queued"
        states = {j.document_id: j.state for j in s.query(IngestJob)}
    assert states == {queued.document.id: "cancelled", other.document.id: "queued"}


def test_counts_cover_live_documents_and_indexed_chunks_only(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    make.indexed(cid, ["one", "two", "three"])
    gone = make.indexed(cid, ["four", "five"])
    make.upload(cid)
    make.indexed(other, ["six"])
    with db.write() as s:
        documents.delete(s, tenant, gone.document_id)
    with db.read() as s:
        assert collections.chunk_count(s, cid) == 3
        assert collections.document_counts(s, cid) == {"indexed": 1, "queued": 1}
        assert collections.indexed_chunks_by_collection(s) == {cid: 3, other: 1}


def test_settings_writes_are_read_back(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid = make.collection(tenant, search_defaults={"k": 5})
    with db.write() as s:
        c = collections.get(s, tenant, cid, lock=True)
        collections.set_index_spec(s, c, "hnsw", {"m": 16})
        collections.set_search_defaults(s, c, {"k": 9})
    with db.write() as s:
        collections.set_tuning(s, cid, {"curve": [1]}, None)  # defaults left as they are
    with db.read() as s:
        c = collections.get(s, tenant, cid)
        assert (c.index_kind, c.index_params, c.search_defaults, c.tuning) == (
            "hnsw", {"m": 16}, {"k": 9}, {"curve": [1]}
        )  # fmt: skip
    with db.write() as s:
        collections.set_tuning(s, cid, {"curve": [2]}, {"k": 3})
        with pytest.raises(NotFound):
            collections.set_tuning(s, "nope", {}, None)
    with db.connect() as conn:
        assert collections.saved_defaults(conn, tenant, cid) == {"k": 3}
