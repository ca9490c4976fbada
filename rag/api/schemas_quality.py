"""Bodies of the quality routes: feedback, the quality series, drift, unanswered topics."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rag.api.schemas import NOT_BLANK, Request

# A comment is a note, not a document: bounded so a rating stays a small row.
MAX_COMMENT = 2000
MAX_CORRECTION = 4000


class FeedbackIn(Request):
    rating: Literal["up", "down"]
    comment: str | None = Field(None, max_length=MAX_COMMENT)
    correct_answer: str | None = Field(
        None, min_length=1, max_length=MAX_CORRECTION, pattern=NOT_BLANK,
        description="the answer that would have been right",
    )  # fmt: skip
    correct_document_id: str | None = Field(
        None, min_length=1, max_length=64,
        description="the document of this collection that answers the question",
    )  # fmt: skip


class FeedbackOut(BaseModel):
    answer_id: str
    rating: str
    comment: str | None
    correct_answer: str | None
    correct_document_id: str | None
    created_at: str | None
    replaced: bool = Field(description="this key had rated the answer before")


class Bucket(BaseModel):
    start: str | None = Field(description="the bucket's start (ISO 8601, UTC)")
    answers: int
    answer_source: dict[str, int] = Field(description="generated | quoted | refused -> count")
    finish_reason: dict[str, int]
    unsupported: int = Field(description="sentences no given passage supports")
    weak: int = Field(description="refused, or answered from a top passage below weak_score")
    top_score: float | None = Field(description="mean score of the top passage")
    score_gap: float | None = Field(description="mean gap between the top two passages")
    first_token_ms: float | None = Field(description="mean time to the first token")
    latency_ms: float | None = Field(description="mean time to the whole answer")
    feedback_up: int
    feedback_down: int


class DriftOut(BaseModel):
    kind: str = Field(description="questions | content")
    score: float = Field(description="last statistic over its threshold (past 1: past it)")
    alert: bool
    statistic: float
    threshold: float
    streak: int = Field(description="tests past the threshold running")
    pinned: bool = Field(description="the reference window was pinned by an operator")
    details: dict[str, float | int | None]
    updated_at: str | None


class QualityOut(BaseModel):
    collection_id: str
    since: str | None
    bucket_s: float
    buckets: list[Bucket]
    totals: dict[str, int]
    drift: list[DriftOut]
    questions_stored: bool


class TopicOut(BaseModel):
    count: int
    refused: int
    examples: list[str] = Field(
        description="questions nearest the topic's centre (empty when question text is not "
        "stored: quality.store_questions off)"
    )
    documents: list[dict[str, str]] = Field(
        description="the documents its questions retrieved most: {id, filename}"
    )
    first_at: str | None
    last_at: str | None


class TopicsOut(BaseModel):
    collection_id: str
    since: str | None
    questions: int = Field(description="refused or weak-evidence questions clustered")
    topics: list[TopicOut]


class PinIn(Request):
    last: int | None = Field(
        None, ge=20, le=2000,
        description="pin the collection's latest this many questions as the reference "
        "(default: quality.drift.reference_size)",
    )  # fmt: skip


class PinOut(BaseModel):
    collection_id: str
    pinned: bool
    reference: int = Field(description="questions in the reference window")
