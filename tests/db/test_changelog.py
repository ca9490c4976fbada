"""The change log (rag.db.changelog): what the indexes catch up from, in seq order, per
collection; a seq is never handed out twice."""

from __future__ import annotations

from sqlalchemy import delete

from rag.db import Database, changelog, collections, documents
from rag.db.models import ChangeLog
from rag.db.purge import purge_documents
from tests.db.conftest import Make


def test_an_index_catches_up_in_order_from_its_watermark(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    first = make.indexed(cid, ["a", "b"])
    theirs = make.indexed(other, ["x"])
    second = make.indexed(cid, ["c"])
    with db.write() as s:
        documents.delete(s, tenant, first.document_id)

    with db.connect() as conn:
        log = changelog.changes_after(conn, cid, 0, 100)
        assert [(op, chunk) for _, op, chunk in log] == [
            ("add", first.chunk_ids[0]), ("add", first.chunk_ids[1]),
            ("add", second.chunk_ids[0]),
            ("remove", first.chunk_ids[0]), ("remove", first.chunk_ids[1]),
        ]  # fmt: skip
        seqs = [seq for seq, _, _ in log]
        assert seqs == sorted(seqs) and len(set(seqs)) == 5
        # A watermark and a limit: the next entries, and only the collection's own.
        assert changelog.changes_after(conn, cid, seqs[1], 2) == log[2:4]
        assert changelog.changes_after(conn, cid, seqs[-1], 10) == []
        assert [c for _, _, c in changelog.changes_after(conn, other, 0, 10)] == theirs.chunk_ids

        assert changelog.removals_after(conn, 0, 10) == [
            (seqs[3], cid, first.document_id, first.chunk_ids[0]),
            (seqs[4], cid, first.document_id, first.chunk_ids[1]),
        ]
        assert changelog.removals_after(conn, seqs[3], 10) == [
            (seqs[4], cid, first.document_id, first.chunk_ids[1])
        ]
        assert changelog.removed_between(conn, cid, seqs[2], seqs[3]) == [first.chunk_ids[0]]
        assert changelog.removed_between(conn, other, 0, seqs[-1]) == []
        assert changelog.last_seq(conn) == seqs[-1]
    with db.read() as s:
        assert changelog.head(s, cid) == seqs[-1]
        assert changelog.head(s, "nothing") == 0
        assert changelog.count_after(s, cid, seqs[1]) == 3
        assert changelog.last_removal_after(s, cid, 0) == seqs[-1]
        assert changelog.last_removal_after(s, other, 0) == 0
        assert changelog.collections_with_reused_ids(s) == []


def test_a_purge_keeps_the_removes_and_drops_the_adds(db: Database, make: Make) -> None:
    """A deleted collection's chunks were not logged at the delete: the purge logs them."""
    tenant, cid = make.tenant_and_collection()
    doc = make.indexed(cid, ["a", "b"])
    with db.write() as s:
        collections.delete(s, tenant, cid)
    with db.connect() as conn:
        assert [op for _, op, _ in changelog.changes_after(conn, cid, 0, 10)] == ["add", "add"]
    purge_documents(db, 10)
    with db.connect() as conn:
        log = changelog.changes_after(conn, cid, 0, 10)
    assert sorted((op, c) for _, op, c in log) == [("remove", c) for c in sorted(doc.chunk_ids)]


def test_a_seq_is_never_handed_out_again(db: Database, make: Make) -> None:
    """An index whose watermark passed a seq never reads an entry written under it later."""
    cid = make.collection(make.tenant())
    make.indexed(cid, ["a"])
    with db.read() as s:
        mark = changelog.head(s, cid)
    make.indexed(cid, ["b", "c"])  # the newest entries, erased below
    with db.write() as s:
        top = changelog.head(s, cid)
        s.execute(delete(ChangeLog).where(ChangeLog.seq > mark))
    make.indexed(cid, ["d"])
    with db.connect() as conn:
        [(seq, op, _)] = changelog.changes_after(conn, cid, mark, 10)
    assert op == "add" and seq > top


def test_a_remove_naming_another_documents_chunk_flags_its_collection(
    db: Database, make: Make
) -> None:
    """What SQLite did before 0008: a purged chunk's id handed to a new chunk."""
    cid = make.collection(make.tenant())
    make.indexed(make.collection(make.tenant()), ["fine"])
    doc = make.indexed(cid, ["reused"])
    with db.write() as s:
        s.add(
            ChangeLog(collection_id=cid, op="remove", chunk_id=doc.chunk_ids[0], document_id="old")
        )
    with db.read() as s:
        assert changelog.collections_with_reused_ids(s) == [cid]
