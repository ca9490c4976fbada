"""The purge (rag.db.purge): what a delete tombstoned leaves the record, and nothing else."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from rag.db import Database, answers, collections, conversations, documents, purge
from rag.db.answers import NewAnswer
from rag.db.conversations import NewTurn, Owner
from rag.db.models import (
    Answer,
    Blob,
    ChangeLog,
    Chunk,
    Collection,
    Conversation,
    ConversationTurn,
    Document,
    IngestJob,
)
from tests.db.conftest import Make


def _count(db: Database, model: type, *where: Any) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def _answer(answer_id: str, tenant: str, cid: str, docs: list[str], **kw: Any) -> NewAnswer:
    return NewAnswer(
        id=answer_id, tenant_id=tenant, collection_id=cid, created_at=kw.pop("at", 1e9),
        question="q", question_embedding=None, answer="a", chunk_ids=[], document_ids=docs,
        settings={}, answer_source="generated", finish_reason="stop", mode="generate",
        top_score=None, score_gap=None, unsupported=0, first_token_ms=None, latency_ms=1.0,
        weak=False, **kw,
    )  # fmt: skip


def _converse(db: Database, owner: Owner, cid: str, *sources: str) -> str:
    with db.write() as s:
        row = conversations.create(s, owner, cid)
        turn = NewTurn("q", "q", "a", "generated", "stop", [], frozenset(sources))
        conversations.append(s, row, turn, 10)
        return row.id


def _delete(db: Database, tenant: str, *document_ids: str) -> None:
    with db.write() as s:
        for doc_id in document_ids:
            documents.delete(s, tenant, doc_id)


def test_a_purge_erases_a_tombstoned_document_and_everything_made_of_it(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid, other = make.collection(tenant), make.collection(tenant)
    doomed = make.indexed(cid, ["d1", "d2"], data=b"shared bytes")
    sharer = make.indexed(other, ["s1"], data=b"shared bytes")  # the tenant's blob, used on
    alone = make.indexed(cid, ["a1"], data=b"own bytes")
    queued = make.upload(cid, b"queued bytes")
    theirs = make.indexed(make.collection(stranger), ["t1"], data=b"own bytes")
    owner = Owner(tenant, "k", False)
    conv = _converse(db, owner, cid, doomed.document_id)
    with db.write() as s:
        answers.insert(s, [_answer("cites", tenant, cid, [doomed.document_id]),
                           _answer("kept", tenant, cid, [])])  # fmt: skip
    _delete(db, tenant, doomed.document_id, alone.document_id, queued.document.id)
    assert purge.pending(db) == 3

    erased = purge.purge_documents(db, 10)
    assert {(p.document_id, p.chunk_ids) for p in erased} == {
        (doomed.document_id, tuple(doomed.chunk_ids)),
        (alone.document_id, tuple(alone.chunk_ids)),
        (queued.document.id, ()),
    }
    assert {(p.tenant_id, p.collection_id) for p in erased} == {(tenant, cid)}
    assert purge.pending(db) == 0
    gone = [doomed.document_id, alone.document_id, queued.document.id]
    assert _count(db, Document, Document.id.in_(gone)) == 0
    assert _count(db, Chunk, Chunk.document_id.in_(gone)) == 0
    assert _count(db, IngestJob) == 0
    assert _count(db, ChangeLog, ChangeLog.document_id.in_(gone), ChangeLog.op == "add") == 0
    assert _count(db, ChangeLog, ChangeLog.op == "remove") == 3  # what the indexes tail
    with db.read() as s:
        blobs = {(t, bytes(d)) for t, d in s.execute(select(Blob.tenant_id, Blob.data))}
        assert blobs == {(tenant, b"shared bytes"), (stranger, b"own bytes")}
        assert set(s.scalars(select(Answer.id))) == {"kept"}
        row = conversations.get(s, owner, cid, conv)
        assert (row.turn_count, row.erased_turns) == (0, 1)
    # What was not deleted is as it was.
    for seeded in (sharer, theirs):
        assert _count(db, Chunk, Chunk.document_id == seeded.document_id) == 1
    assert purge.purge_documents(db, 10) == []


def test_the_oldest_deletes_go_first_a_batch_at_a_time(db: Database, make: Make) -> None:
    tenant, cid = make.tenant_and_collection()
    ids = [make.upload(cid).document.id for _ in range(3)]
    _delete(db, tenant, *ids)
    with db.write() as s:
        for age, doc_id in zip((10.0, 30.0, 20.0), ids, strict=True):
            s.execute(update(Document).where(Document.id == doc_id).values(deleted_at=1e9 - age))
    assert {p.document_id for p in purge.purge_documents(db, 2)} == {ids[1], ids[2]}
    assert [p.document_id for p in purge.purge_documents(db, 2)] == [ids[0]]


def test_a_deleted_collection_goes_once_its_documents_are_purged(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, kept = make.collection(tenant), make.collection(tenant)
    doc = make.indexed(cid, ["c1", "c2"])
    owner = Owner(tenant, "k", False)
    conv = _converse(db, owner, cid)
    kept_conv = _converse(db, owner, kept)
    with db.write() as s:
        answers.insert(s, [_answer("in-it", tenant, cid, []), _answer("kept", tenant, kept, [])])
        collections.delete(s, tenant, cid)
    assert purge.pending(db) == 2  # the collection and its document

    assert purge.purge_collections(db) == []  # its document is not purged yet
    assert _count(db, Collection, Collection.id == cid) == 1
    [erased] = purge.purge_documents(db, 10)
    assert sorted(erased.chunk_ids) == sorted(doc.chunk_ids)
    # The delete logged nothing for its chunks: the purge does.
    removes = _count(db, ChangeLog, ChangeLog.collection_id == cid, ChangeLog.op == "remove")
    assert removes == 2

    assert purge.purge_collections(db) == [cid]
    assert _count(db, Collection) == 1
    with db.read() as s:
        assert set(s.scalars(select(Conversation.id))) == {kept_conv}
        assert set(s.scalars(select(Answer.id))) == {"kept"}
        assert conv not in set(s.scalars(select(ConversationTurn.conversation_id)))
    assert purge.pending(db) == 0


def test_conversations_and_answers_go_when_deleted_or_past_their_retention(
    db: Database, make: Make
) -> None:
    owner, cid = make.key_in_collection()
    tenant = owner.tenant_id
    deleted, stale, fresh = (_converse(db, owner, cid) for _ in range(3))
    with db.write() as s:
        conversations.delete_one(s, owner, cid, deleted)
        s.execute(update(Conversation).where(Conversation.id == stale).values(updated_at=1.0))
        answers.insert(s, [
            _answer("turn", tenant, cid, [], conversation_id=deleted),
            _answer("old", tenant, cid, [], at=100.0), _answer("new", tenant, cid, [], at=1e12),
        ])  # fmt: skip
    assert purge.pending(db) == 1
    assert purge.pending(db, retention_s=3600.0) == 2

    assert purge.purge_conversations(db, None, 10) == [deleted]
    assert purge.purge_conversations(db, 3600.0, 10) == [stale]
    with db.read() as s:
        assert set(s.scalars(select(Conversation.id))) == {fresh}
        assert set(s.scalars(select(Answer.id))) == {"old", "new"}  # the turn's went with it
    assert purge.expire_answers(db, before=1000.0, limit=10) == 1
    with db.read() as s:
        assert set(s.scalars(select(Answer.id))) == {"new"}
    assert purge.reclaim(db) is True
