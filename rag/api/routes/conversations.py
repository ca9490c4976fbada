"""Stored conversations: POST/GET /v1/collections/{id}/conversations, GET/DELETE
.../conversations/{conversation_id}, and the two steps POST /ask takes with a
`conversation_id` (`join` before answering, `record` after).

A conversation belongs to the key that created it; the tenant's admin keys may list, read and
delete all of the tenant's. Anyone else gets 404. A delete is immediate for every reader and
erased from the database's files by the purge, as a deleted document's turns are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Path, Query, Response

from rag import quota as quotas
from rag.answer.generate import Prepared
from rag.answer.history import Turn
from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, errors
from rag.api.schemas_conversations import (
    ConversationList,
    ConversationOut,
    ConversationSummary,
)
from rag.auth import Principal
from rag.db import conversations
from rag.errors import QuotaExceeded
from rag.services import Services

router = Router(
    prefix="/v1/collections/{collection_id}/conversations",
    tags=["conversations"],
    responses=AUTHENTICATED,
)

CollectionId = Annotated[str, Path(max_length=64)]
ConversationId = Annotated[str, Path(max_length=64)]


def owner_of(principal: Principal) -> conversations.Owner:
    return conversations.Owner(principal.tenant_id, principal.key_id, principal.is_admin)


@router.post("", status_code=201, response_model=ConversationOut, responses=errors(403, 404))
async def create_conversation(
    collection_id: CollectionId, services: ServicesDep, principal: CurrentPrincipal,
    pools: PoolsDep,
) -> ConversationOut:  # fmt: skip
    """A new, empty conversation over the collection; ask in it with POST /ask and its id."""

    def create() -> ConversationOut:
        quota = services.settings.quota
        with services.db.write() as session:
            quotas.guard_writes(session, principal.tenant_id, quota)
            row = conversations.create(session, owner_of(principal), collection_id)
            quotas.check_conversations(session, principal.tenant_id, quota)
            return ConversationOut.of(row, [])

    return await pools.db.run(create)


@router.get("", response_model=ConversationList, responses=errors(404))
async def list_conversations(
    collection_id: CollectionId,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> ConversationList:
    """The conversations this key may see (an admin key: all of its tenant's), most
    recently active first; `next_cursor` fetches the next page."""

    def listing() -> ConversationList:
        with services.db.read() as session:
            rows, next_cursor = conversations.list_page(
                session, owner_of(principal), collection_id, cursor=cursor,
                limit=min(limit, services.settings.conversations.page_size),
            )  # fmt: skip
            first = conversations.first_questions(session, [r.id for r in rows])
        items = [ConversationSummary.of(r, first.get(r.id)) for r in rows]
        return ConversationList(conversations=items, next_cursor=next_cursor)

    return await pools.db.run(listing)


@router.get("/{conversation_id}", response_model=ConversationOut, responses=errors(404))
async def get_conversation(
    collection_id: CollectionId, conversation_id: ConversationId, services: ServicesDep,
    principal: CurrentPrincipal, pools: PoolsDep,
) -> ConversationOut:  # fmt: skip
    """The conversation and its turns, oldest first: each with its answer, citations and
    the query it searched. Turns that cited a document deleted since are gone."""

    def one() -> ConversationOut:
        with services.db.read() as session:
            row = conversations.get(session, owner_of(principal), collection_id, conversation_id)
            return ConversationOut.of(row, conversations.turns(session, row.id))

    return await pools.db.run(one)


@router.delete(
    "/{conversation_id}", status_code=204, response_class=Response, responses=errors(404)
)
async def delete_conversation(
    collection_id: CollectionId, conversation_id: ConversationId, services: ServicesDep,
    principal: CurrentPrincipal, pools: PoolsDep,
) -> Response:  # fmt: skip
    """Gone from every listing at once; its text leaves the database within the purge
    interval (RAG_PURGE__INTERVAL_S)."""

    def delete() -> None:
        with services.db.write() as session:
            conversations.delete_one(session, owner_of(principal), collection_id, conversation_id)

    await pools.db.run(delete)
    return Response(status_code=204)


# ---------------------------------------------------------------- POST /ask's two steps


@dataclass(frozen=True)
class Joined:
    """A conversation an answer joins: whose it is, and its latest turns (the history)."""

    owner: conversations.Owner
    collection_id: str
    conversation_id: str
    history: tuple[Turn, ...]


def join(
    services: Services, principal: Principal, collection_id: str, conversation_id: str,
    question: str,
) -> Joined:  # fmt: skip
    """Before answering: the conversation (404 when this key may not see it), its latest
    turns, and the refusals that need no answer (a full conversation, a quota already
    reached)."""
    owner = owner_of(principal)
    settings = services.settings
    with services.db.read() as session:
        row = conversations.get(session, owner, collection_id, conversation_id)
        conversations.check_room(row, settings.conversations.max_turns)
        limit = settings.quota.max_conversation_mb
        if limit is not None:
            _count, used = conversations.usage(session, principal.tenant_id)
            if used + len(question.encode()) > limit * quotas.MB:
                raise QuotaExceeded(
                    f"this tenant's conversations hold {used} bytes of text, the most its "
                    "quota allows: delete a conversation first",
                    detail={"quota": "conversation_bytes", "limit": int(limit * quotas.MB),
                            "used": used},
                )  # fmt: skip
        rows = conversations.turns(session, row.id, last=settings.ask.max_history_turns)
    history = tuple(Turn(t.question, t.answer, t.searched_query) for t in rows)
    return Joined(owner, collection_id, conversation_id, history)


def record(
    services: Services, joined: Joined, question: str, prep: Prepared, out: dict[str, Any]
) -> None:
    """After answering: the turn added to the conversation (`out` is the final event's
    body; it gets the conversation's id)."""
    quota = services.settings.quota
    turn = conversations.NewTurn(
        question=question,
        searched_query=prep.searched_query or question,
        answer=str(out["answer"]),
        answer_source=str(out["answer_source"]),
        finish_reason=str(out["finish_reason"]),
        citations=list(out["citations"]),
        document_ids=frozenset(p.document_id for p in prep.passages),
    )
    with services.db.write() as session:
        quotas.guard_writes(session, joined.owner.tenant_id, quota)
        row = conversations.get(
            session, joined.owner, joined.collection_id, joined.conversation_id, lock=True
        )
        conversations.append(session, row, turn, services.settings.conversations.max_turns)
        quotas.check_conversations(session, joined.owner.tenant_id, quota, added_bytes=turn.bytes)
    out["conversation_id"] = joined.conversation_id
