"""Bodies of the conversation routes: a conversation, its turns, a page of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from rag.api.schemas import iso
from rag.db.models import Conversation, ConversationTurn


class TurnOut(BaseModel):
    ordinal: int = Field(description="the turn's place in the conversation, from 1")
    question: str = Field(description="as asked")
    searched_query: str = Field(description="what was searched and answered (a follow-up "
                                "made stand-alone, else the question)")  # fmt: skip
    answer: str
    answer_source: str = Field(description="generated | quoted | refused")
    finish_reason: str
    citations: list[dict[str, Any]] = Field(description="as in the answer's final event")
    created_at: str | None

    @classmethod
    def of(cls, t: ConversationTurn) -> TurnOut:
        return cls(
            ordinal=t.ordinal, question=t.question, searched_query=t.searched_query,
            answer=t.answer, answer_source=t.answer_source, finish_reason=t.finish_reason,
            citations=list(t.citations or []), created_at=iso(t.created_at),
        )  # fmt: skip


class ConversationSummary(BaseModel):
    id: str
    collection_id: str
    turn_count: int
    erased_turns: int = Field(description="turns erased because a document they cited was deleted")
    bytes: int = Field(description="bytes of its turns' text (the tenant's quota counts them)")
    first_question: str | None = Field(description="its first remaining question")
    created_at: str | None
    updated_at: str | None

    @classmethod
    def of(cls, c: Conversation, first_question: str | None) -> ConversationSummary:
        return cls(
            id=c.id, collection_id=c.collection_id, turn_count=c.turn_count,
            erased_turns=c.erased_turns, bytes=c.bytes, first_question=first_question,
            created_at=iso(c.created_at), updated_at=iso(c.updated_at),
        )  # fmt: skip


class ConversationOut(ConversationSummary):
    turns: list[TurnOut]

    @classmethod
    def of(  # type: ignore[override]
        cls, c: Conversation, turns: Sequence[ConversationTurn]
    ) -> ConversationOut:
        summary = ConversationSummary.of(c, turns[0].question if turns else None)
        return cls(**summary.model_dump(), turns=[TurnOut.of(t) for t in turns])


class ConversationList(BaseModel):
    conversations: list[ConversationSummary]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")
