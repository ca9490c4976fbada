"""Conversations: a key's questions and answers over one collection, turn by turn.

A conversation is visible to the key that created it, and to its tenant's admin keys; a
lookup by anyone else answers NotFound, so a guessed id never reveals that it exists. A delete
tombstones it (gone from every answer at once); the purge erases its rows (rag.db.purge),
as it erases the turns whose passages came from a deleted document and the conversations
of a deleted collection or past the retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, select, update
from sqlalchemy.orm import Session

from rag.db import collections, cursors
from rag.db.models import Conversation, ConversationSource, ConversationTurn, Document, now
from rag.errors import Conflict, NotFound


@dataclass(frozen=True)
class Owner:
    """Who asks: a key of a tenant, admin or not."""

    tenant_id: str
    key_id: str
    is_admin: bool


@dataclass(frozen=True)
class NewTurn:
    question: str
    searched_query: str
    answer: str
    answer_source: str
    finish_reason: str
    citations: list[dict[str, Any]]
    document_ids: frozenset[str]  # the documents the turn's passages came from

    @property
    def bytes(self) -> int:
        return sum(len(t.encode()) for t in (self.question, self.searched_query, self.answer))


def _visible(owner: Owner) -> ColumnElement[bool]:
    mine = Conversation.tenant_id == owner.tenant_id
    if owner.is_admin:
        return mine & Conversation.deleted_at.is_(None)
    return mine & (Conversation.key_id == owner.key_id) & Conversation.deleted_at.is_(None)


def create(session: Session, owner: Owner, collection_id: str) -> Conversation:
    collections.get(session, owner.tenant_id, collection_id)
    t = now()
    row = Conversation(
        tenant_id=owner.tenant_id, collection_id=collection_id, key_id=owner.key_id,
        turn_count=0, erased_turns=0, bytes=0, created_at=t, updated_at=t,
    )  # fmt: skip
    session.add(row)
    session.flush()
    return row


def get(
    session: Session, owner: Owner, collection_id: str, conversation_id: str, *,
    lock: bool = False,
) -> Conversation:  # fmt: skip
    """A live conversation of the collection that `owner` may see, or NotFound."""
    stmt = select(Conversation).where(
        Conversation.id == conversation_id,
        Conversation.collection_id == collection_id,
        _visible(owner),
    )
    if lock:
        stmt = stmt.with_for_update()
    row = session.scalar(stmt)
    if row is None:
        raise NotFound(f"conversation {conversation_id} not found")
    collections.get(session, owner.tenant_id, collection_id)
    return row


def list_page(
    session: Session, owner: Owner, collection_id: str, *, limit: int, cursor: str | None = None
) -> tuple[list[Conversation], str | None]:
    """The collection's conversations `owner` may see, most recently updated first."""
    collections.get(session, owner.tenant_id, collection_id)
    stmt = select(Conversation).where(Conversation.collection_id == collection_id, _visible(owner))
    if cursor:
        updated, cid = cursors.decode(cursor)
        stmt = stmt.where(
            (Conversation.updated_at < updated)
            | ((Conversation.updated_at == updated) & (Conversation.id < cid))
        )
    stmt = stmt.order_by(Conversation.updated_at.desc(), Conversation.id.desc()).limit(limit + 1)
    return cursors.page(list(session.scalars(stmt)), limit, lambda c: (c.updated_at, c.id))


def turns(
    session: Session, conversation_id: str, last: int | None = None
) -> list[ConversationTurn]:
    """The conversation's turns, oldest first; `last`: only the latest so many. A turn whose
    passages came from a document deleted since is left out at once (the purge erases it)."""
    gone = exists().where(
        ConversationSource.turn_id == ConversationTurn.id,
        ~exists().where(
            Document.id == ConversationSource.document_id, Document.deleted_at.is_(None)
        ),
    )
    stmt = select(ConversationTurn).where(
        ConversationTurn.conversation_id == conversation_id, ~gone
    )
    if last is not None:
        stmt = stmt.order_by(ConversationTurn.ordinal.desc()).limit(last)
        return list(reversed(list(session.scalars(stmt))))
    return list(session.scalars(stmt.order_by(ConversationTurn.ordinal)))


def first_questions(session: Session, conversation_ids: Sequence[str]) -> dict[str, str]:
    """Each conversation's first remaining question (a listing's preview)."""
    if not conversation_ids:
        return {}
    first = (
        select(ConversationTurn.conversation_id, func.min(ConversationTurn.ordinal).label("o"))
        .where(ConversationTurn.conversation_id.in_(conversation_ids))
        .group_by(ConversationTurn.conversation_id)
        .subquery()
    )
    stmt = select(ConversationTurn.conversation_id, ConversationTurn.question).join(
        first,
        (first.c.conversation_id == ConversationTurn.conversation_id)
        & (first.c.o == ConversationTurn.ordinal),
    )
    return {cid: q for cid, q in session.execute(stmt)}


def check_room(row: Conversation, max_turns: int) -> None:
    """Conflict (409) when the conversation holds the most turns one may."""
    if row.turn_count >= max_turns:
        raise Conflict(
            f"this conversation holds {row.turn_count} turns, the most one may; start another"
        )


def append(session: Session, row: Conversation, turn: NewTurn, max_turns: int) -> ConversationTurn:
    """Add a turn to a conversation locked by the caller (`get(..., lock=True)`)."""
    check_room(row, max_turns)
    ordinal = int(
        session.scalar(
            select(func.coalesce(func.max(ConversationTurn.ordinal), 0)).where(
                ConversationTurn.conversation_id == row.id
            )
        )
        or 0
    )
    added = ConversationTurn(
        conversation_id=row.id, ordinal=max(ordinal, row.turn_count + row.erased_turns) + 1,
        question=turn.question, searched_query=turn.searched_query, answer=turn.answer,
        answer_source=turn.answer_source, finish_reason=turn.finish_reason,
        citations=turn.citations, bytes=turn.bytes, created_at=now(),
    )  # fmt: skip
    session.add(added)
    session.flush()
    session.add_all(ConversationSource(turn_id=added.id, document_id=d) for d in turn.document_ids)
    row.turn_count += 1
    row.bytes += turn.bytes
    row.updated_at = added.created_at
    return added


def delete_one(session: Session, owner: Owner, collection_id: str, conversation_id: str) -> None:
    """Tombstone: gone from every listing and answer now, erased by the next purge."""
    row = get(session, owner, collection_id, conversation_id, lock=True)
    row.deleted_at = now()


def usage(session: Session, tenant_id: str) -> tuple[int, int]:
    """The tenant's live conversations: how many, and the bytes of their turns' text."""
    stmt = select(func.count(), func.coalesce(func.sum(Conversation.bytes), 0)).where(
        Conversation.tenant_id == tenant_id, Conversation.deleted_at.is_(None)
    )
    count, size = session.execute(stmt).one()
    return int(count), int(size)


# ---------------------------------------------------------------- the purge's part


def erase_turns_of_documents(session: Session, document_ids: Sequence[str]) -> int:
    """Erase the turns whose passages came from these documents (their text with them);
    their conversations stay, counting what was erased. How many turns went."""
    if not document_ids:
        return 0
    rows = session.execute(
        select(ConversationTurn.id, ConversationTurn.conversation_id, ConversationTurn.bytes)
        .join(ConversationSource, ConversationSource.turn_id == ConversationTurn.id)
        .where(ConversationSource.document_id.in_(document_ids))
        .distinct()
    ).all()
    if not rows:
        return 0
    per: dict[str, tuple[int, int]] = {}
    for _id, cid, size in rows:
        n, b = per.get(cid, (0, 0))
        per[cid] = (n + 1, b + int(size))
    ids = [r[0] for r in rows]
    session.execute(delete(ConversationSource).where(ConversationSource.turn_id.in_(ids)))
    session.execute(delete(ConversationTurn).where(ConversationTurn.id.in_(ids)))
    for cid, (n, b) in sorted(per.items()):
        session.execute(
            update(Conversation)
            .where(Conversation.id == cid)
            .values(
                turn_count=Conversation.turn_count - n,
                erased_turns=Conversation.erased_turns + n,
                bytes=Conversation.bytes - b,
            )
        )
    return len(ids)


def erase(session: Session, where: ColumnElement[bool], limit: int) -> list[str]:
    """Erase up to `limit` conversations matching `where`, with every turn; their ids."""
    ids = list(session.scalars(select(Conversation.id).where(where).limit(limit)))
    if not ids:
        return []
    turn_ids = select(ConversationTurn.id).where(ConversationTurn.conversation_id.in_(ids))
    session.execute(delete(ConversationSource).where(ConversationSource.turn_id.in_(turn_ids)))
    session.execute(delete(ConversationTurn).where(ConversationTurn.conversation_id.in_(ids)))
    session.execute(delete(Conversation).where(Conversation.id.in_(ids)))
    return ids


def doomed(retention_s: float | None, collection_ids: Sequence[str] = ()) -> ColumnElement[bool]:
    """Conversations the purge erases: deleted ones, those of `collection_ids` (deleted
    collections), and with a retention those untouched for longer."""
    cond: ColumnElement[bool] = Conversation.deleted_at.is_not(None)
    if collection_ids:
        cond = cond | Conversation.collection_id.in_(list(collection_ids))
    if retention_s is not None:
        cond = cond | (Conversation.updated_at < now() - retention_s)
    return cond


def pending(session: Session, retention_s: float | None) -> int:
    return int(
        session.scalar(select(func.count()).select_from(Conversation).where(doomed(retention_s)))
        or 0
    )
