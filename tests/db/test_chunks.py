"""Chunks (rag.db.chunks): ids never handed out twice, reads that show a tenant only its own
live chunks, metadata filters with the same meaning on both databases, and the vectors the
indexes are built from."""

from __future__ import annotations

import numpy as np
import pytest

from rag.db import Database, chunks, documents, seed
from rag.db.ingested import ChunkRow
from rag.db.purge import purge_documents
from rag.errors import Invalid, NotFound
from tests.db.conftest import DIM, MODEL, Make, unit_vector


def test_a_purged_chunks_id_is_never_handed_out_again(db: Database, make: Make) -> None:
    """The indexes key vectors and "remove" entries by chunk id: an id that came back would
    attach a new passage to a removal already applied, or to an old vector."""
    tenant, cid = make.tenant_and_collection()
    make.indexed(cid, ["kept"])
    newest = make.indexed(cid, ["gone one", "gone two"])  # the highest ids there are
    with db.write() as s:
        documents.delete(s, tenant, newest.document_id)
    [purged] = purge_documents(db, 10)
    assert sorted(purged.chunk_ids) == sorted(newest.chunk_ids)

    after = make.indexed(cid, ["new one", "new two"])
    assert min(after.chunk_ids) > max(newest.chunk_ids)


def test_hydrate_and_visible_ids_show_a_tenant_its_own_live_chunks_only(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid = make.collection(tenant)
    live = make.indexed(cid, ["alpha", "beta"], meta={"lang": "en"}, filename="a.txt")
    gone = make.indexed(cid, ["gamma"])
    theirs = make.indexed(make.collection(stranger), ["delta"])
    with db.write() as s:
        documents.delete(s, tenant, gone.document_id)
    asked = live.chunk_ids + gone.chunk_ids + theirs.chunk_ids

    with db.connect() as conn:
        rows = chunks.hydrate(conn, tenant, cid, asked)
        assert sorted(rows) == sorted(live.chunk_ids)
        first = rows[live.chunk_ids[0]]
        assert (first.text, first.start_char, first.end_char, first.ordinal) == ("alpha", 0, 5, 0)
        assert (first.filename, first.meta, first.document_id) == (
            "a.txt", {"lang": "en"}, live.document_id
        )  # fmt: skip
        assert chunks.hydrate(conn, stranger, cid, asked) == {}
        assert chunks.hydrate(conn, tenant, cid, []) == {}
        assert chunks.live_among(conn, cid, asked) == set(live.chunk_ids)
    with db.read() as s:
        assert chunks.visible_ids(s, tenant, cid, asked) == set(live.chunk_ids)
        assert chunks.visible_ids(s, stranger, cid, asked) == set()
        passages = chunks.passages_of(s, tenant, cid, 10)
        assert [(r.id, r.text, r.filename) for r in passages] == [
            (live.chunk_ids[0], "alpha", "a.txt"), (live.chunk_ids[1], "beta", "a.txt")
        ]  # fmt: skip
        assert chunks.passages_of(s, stranger, cid, 10) == []


def test_list_page_pages_a_documents_chunks_in_order(db: Database, make: Make) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    doc = make.indexed(make.collection(tenant), ["p0", "p1", "p2", "p3", "p4"])
    with db.read() as s:
        pages = [
            [c.text for c in chunks.list_page(s, tenant, doc.document_id, limit=2, offset=o)]
            for o in (0, 2, 4)
        ]
        assert pages == [["p0", "p1"], ["p2", "p3"], ["p4"]]
        with pytest.raises(NotFound):
            chunks.list_page(s, stranger, doc.document_id, limit=2, offset=0)


def test_a_metadata_filter_matches_the_value_and_its_json_type(db: Database, make: Make) -> None:
    tenant, cid = make.tenant_and_collection()
    by_meta = {
        name: make.indexed(cid, [f"passage {name}"], meta={"n": value}).chunk_ids[0]
        for name, value in [("int", 3), ("float", 3.0), ("text", "3"), ("true", True), ("one", 1)]
    }
    tagged = make.indexed(cid, ["tagged"], meta={"tag": "x", "n": "x"})
    gone = make.indexed(cid, ["gone"], meta={"n": 3})
    with db.write() as s:
        documents.delete(s, tenant, gone.document_id)

    def allowed(metadata: dict[str, chunks.MetaValue], docs: list[str] | None = None) -> set[int]:
        with db.read() as s:
            return chunks.allowed_ids(s, cid, docs, metadata)

    assert allowed({"n": 3}) == {by_meta["int"], by_meta["float"]}
    assert allowed({"n": "3"}) == {by_meta["text"]}
    assert allowed({"n": True}) == {by_meta["true"]}
    assert allowed({"n": 1}) == {by_meta["one"]}
    assert allowed({"tag": "x", "n": "x"}) == {tagged.chunk_ids[0]}
    assert allowed({}, [tagged.document_id]) == {tagged.chunk_ids[0]}
    assert len(allowed({})) == 6
    with pytest.raises(Invalid):
        allowed({"missing": 1})
    with db.read() as s:
        chunks.metadata_keys_known(s, cid, {"tag": "y"})
        with pytest.raises(Invalid):
            chunks.metadata_keys_known(s, cid, {"missing": "y"})


def test_the_vectors_an_index_is_built_from_are_the_live_ones_of_its_model(
    db: Database, make: Make
) -> None:
    tenant, cid = make.tenant_and_collection()
    live = make.indexed(cid, ["one", "two", "three"])
    gone = make.indexed(cid, ["four"])
    other_model = seed.documents(
        db, cid,
        [seed.SeedDocument("m.txt", b"m", "five", [ChunkRow(0, "five", 0, 4, 1)],
                           unit_vector("five")[None, :])],
        "another-model",
    )[0]  # fmt: skip
    with db.write() as s:
        documents.delete(s, tenant, gone.document_id)

    with db.read() as s:
        batches = list(chunks.live_vectors(s, cid, MODEL, DIM, batch=2))
        assert [len(ids) for ids, _ in batches] == [2, 1]
        ids = np.concatenate([i for i, _ in batches])
        vectors = np.concatenate([v for _, v in batches])
        assert ids.tolist() == sorted(live.chunk_ids)
        expected = np.stack([unit_vector(t) for t in ("one", "two", "three")])
        np.testing.assert_array_equal(vectors, expected)
        assert chunks.live_ids(s, cid, MODEL).tolist() == sorted(live.chunk_ids)
        assert chunks.live_count(s, cid, MODEL) == 3
        assert chunks.live_ids(s, cid, "another-model").tolist() == other_model.chunk_ids
        assert chunks.count(s, cid) == 5  # tombstoned rows still count until the purge

        got_ids, got = chunks.vectors_of(
            s, cid, MODEL, DIM, [live.chunk_ids[1], *gone.chunk_ids, *other_model.chunk_ids]
        )
        assert got_ids.tolist() == [live.chunk_ids[1]]
        np.testing.assert_array_equal(got, unit_vector("two")[None, :])
        empty_ids, empty = chunks.vectors_of(s, cid, MODEL, DIM, [])
        assert (empty_ids.shape, empty.shape) == ((0,), (0, DIM))


def test_lookups_by_chunk_id(db: Database, make: Make) -> None:
    cid = make.collection(make.tenant())
    doc = make.indexed(cid, ["one", "two"], meta={"k": "v"})
    other = make.indexed(cid, ["three"])
    empty = make.collection(make.tenant())
    with db.read() as s:
        assert chunks.attributes_of(s, cid, [doc.chunk_ids[1], 999_999, other.chunk_ids[0]]) == [
            (doc.document_id, {"k": "v"}), ("", {}), (other.document_id, {})
        ]  # fmt: skip
        assert chunks.attributes_of(s, cid, []) == []
        assert chunks.documents_of_chunks(s, [*doc.chunk_ids, 999_999]) == {
            doc.chunk_ids[0]: doc.document_id, doc.chunk_ids[1]: doc.document_id
        }  # fmt: skip
        sample = chunks.sample_texts(s, cid, 2, seed=1)
        assert len(sample) == 2 and set(sample) <= {"one", "two", "three"}
        assert sample == chunks.sample_texts(s, cid, 2, seed=1)
        assert sorted(chunks.sample_texts(s, cid, 10)) == ["one", "three", "two"]
        assert chunks.sample_texts(s, empty, 3) == []
