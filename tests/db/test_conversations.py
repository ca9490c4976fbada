"""Conversations (rag.db.conversations): seen by the key that made them and its tenant's
admins only, turns in order, a deleted source erases its turns, pages that neither skip nor
repeat, and what the purge erases."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from rag.db import Database, conversations, documents
from rag.db.conversations import NewTurn, Owner
from rag.db.models import Conversation
from rag.errors import Conflict, NotFound
from tests.db.conftest import Make


def _turn(question: str, *sources: str) -> NewTurn:
    return NewTurn(
        question=question, searched_query=question, answer=f"answer to {question}",
        answer_source="generated", finish_reason="stop", citations=[{"n": 1}],
        document_ids=frozenset(sources),
    )  # fmt: skip


def _start(db: Database, owner: Owner, cid: str) -> str:
    with db.write() as s:
        return conversations.create(s, owner, cid).id


def _append(db: Database, owner: Owner, cid: str, conv: str, turn: NewTurn, most: int = 10) -> int:
    with db.write() as s:
        row = conversations.get(s, owner, cid, conv, lock=True)
        return conversations.append(s, row, turn, most).ordinal


def _questions(db: Database, conv: str, last: int | None = None) -> list[str]:
    with db.read() as s:
        return [t.question for t in conversations.turns(s, conv, last)]


def test_a_conversation_is_seen_by_its_key_and_its_tenants_admins_only(
    db: Database, make: Make
) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    cid, elsewhere = make.collection(tenant), make.collection(tenant)
    mine = Owner(tenant, "key-1", is_admin=False)
    conv = _start(db, mine, cid)
    with db.read() as s:
        for who in (mine, Owner(tenant, "key-admin", is_admin=True)):
            assert conversations.get(s, who, cid, conv).key_id == "key-1"
        for who in (Owner(tenant, "key-2", False), Owner(stranger, "key-1", True)):
            with pytest.raises(NotFound):
                conversations.get(s, who, cid, conv)
        with pytest.raises(NotFound):
            conversations.get(s, mine, elsewhere, conv)
    with db.write() as s, pytest.raises(NotFound):
        conversations.create(s, Owner(stranger, "k", True), cid)


def test_turns_are_numbered_in_order_and_a_full_conversation_takes_no_more(
    db: Database, make: Make
) -> None:
    owner, cid = make.key_in_collection()
    tenant = owner.tenant_id
    conv = _start(db, owner, cid)
    ordinals = [_append(db, owner, cid, conv, _turn(q), most=3) for q in ("q1", "q2", "q3")]
    assert ordinals == [1, 2, 3]
    with pytest.raises(Conflict):
        _append(db, owner, cid, conv, _turn("q4"), most=3)

    assert _questions(db, conv) == ["q1", "q2", "q3"]
    assert _questions(db, conv, last=2) == ["q2", "q3"]
    with db.read() as s:
        row = conversations.get(s, owner, cid, conv)
        assert row.turn_count == 3
        assert row.bytes == sum(_turn(q).bytes for q in ("q1", "q2", "q3"))
        assert conversations.usage(s, tenant) == (1, row.bytes)
        assert conversations.first_questions(s, [conv, "nope"]) == {conv: "q1"}


def test_a_deleted_source_hides_its_turns_and_the_purge_erases_them(
    db: Database, make: Make
) -> None:
    owner, cid = make.key_in_collection()
    tenant = owner.tenant_id
    source, other = make.upload(cid).document.id, make.upload(cid).document.id
    conv = _start(db, owner, cid)
    for turn in (_turn("q1", other), _turn("q2", source), _turn("q3", source, other)):
        _append(db, owner, cid, conv, turn)
    with db.write() as s:
        documents.delete(s, tenant, source)
    assert _questions(db, conv) == ["q1"]  # at once, before the purge

    with db.write() as s:
        assert conversations.erase_turns_of_documents(s, [source]) == 2
        assert conversations.erase_turns_of_documents(s, []) == 0
    with db.read() as s:
        row = conversations.get(s, owner, cid, conv)
        assert (row.turn_count, row.erased_turns, row.bytes) == (1, 2, _turn("q1").bytes)
        assert conversations.first_questions(s, [conv]) == {conv: "q1"}
    # The next turn's ordinal follows the erased ones: a client's numbering stays valid.
    assert _append(db, owner, cid, conv, _turn("q4")) == 4
    assert _questions(db, conv) == ["q1", "q4"]


def test_pages_of_conversations_newest_first_neither_skip_nor_repeat(
    db: Database, make: Make
) -> None:
    owner, cid = make.key_in_collection()
    tenant = owner.tenant_id
    ids = [_start(db, owner, cid) for _ in range(7)]
    _start(db, Owner(tenant, "other-key", False), cid)  # not the owner's
    with db.write() as s:  # ties broken by id
        s.execute(update(Conversation).where(Conversation.id.in_(ids[1:5])).values(updated_at=5.0))
    _append(db, owner, cid, ids[1], _turn("touched"))  # now the most recently updated

    seen: list[str] = []
    cursor: str | None = None
    while True:
        with db.read() as s:
            page, cursor = conversations.list_page(s, owner, cid, limit=2, cursor=cursor)
        seen += [c.id for c in page]
        if cursor is None:
            break
    assert seen[0] == ids[1]
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
    with db.read() as s:
        admin_view, _ = conversations.list_page(s, Owner(tenant, "a", True), cid, limit=20)
    assert len(admin_view) == 8


def test_a_delete_tombstones_and_the_purge_erases_deleted_and_stale_conversations(
    db: Database, make: Make
) -> None:
    owner, cid = make.key_in_collection()
    deleted, stale, fresh = (_start(db, owner, cid) for _ in range(3))
    for conv in (deleted, stale, fresh):
        _append(db, owner, cid, conv, _turn("q"))
    with db.write() as s:
        conversations.delete_one(s, owner, cid, deleted)
        s.execute(update(Conversation).where(Conversation.id == stale).values(updated_at=1.0))
    with db.read() as s:
        with pytest.raises(NotFound):
            conversations.get(s, owner, cid, deleted)
        assert conversations.usage(s, owner.tenant_id)[0] == 2
        assert conversations.pending(s, None) == 1
        assert conversations.pending(s, 3600.0) == 2

    with db.write() as s:
        assert conversations.erase(s, conversations.doomed(3600.0), 10) in (
            [deleted, stale], [stale, deleted]
        )  # fmt: skip
    assert _questions(db, deleted) == [] and _questions(db, stale) == []
    assert _questions(db, fresh) == ["q"]
    with db.write() as s:
        assert conversations.erase(s, conversations.doomed(None, [cid]), 10) == [fresh]
        assert conversations.erase(s, conversations.doomed(None), 10) == []
