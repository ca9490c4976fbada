"""Bodies of search and of a collection's search settings: the query and its knobs, the
passages found, a rebuild, the defaults a collection keeps, a warm-up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, model_validator

from rag.api.schemas import (
    MAX_META_KEYS,
    NOT_BLANK,
    Id,
    IndexKind,
    IndexParams,
    MetaKey,
    MetaValue,
    Request,
)
from rag.index.live import IndexState
from rag.retrieve import Passage

if TYPE_CHECKING:  # the annotation only: rag.ops.tune loads the services it runs on
    from rag.ops.tune import TuneReport


class SearchFilter(Request):
    document_ids: list[Id] | None = Field(None, max_length=10_000)
    metadata: dict[MetaKey, MetaValue] | None = Field(
        None,
        max_length=MAX_META_KEYS,
        description="documents whose metadata has all these key/values",
    )


class TurnIn(Request):
    """An earlier turn of a conversation, as the client saw it."""

    question: str = Field(min_length=1, max_length=4000, pattern=NOT_BLANK)
    answer: str = Field("", max_length=16_000)


class SearchIn(Request):
    query: str = Field(min_length=1, max_length=4000, pattern=NOT_BLANK)
    k: int | None = Field(
        None, ge=1, le=1000, description="passages to return (max 200 by default)"
    )
    ef_search: int | None = Field(None, ge=1, le=10_000, description="HNSW candidate list; >= k")
    nprobe: int | None = Field(None, ge=1, le=65_536, description="IVF lists to scan")
    exact: bool | None = Field(None, description="brute force over every vector")
    hybrid: float | None = Field(
        None, ge=0, le=1, description="keyword (BM25) weight in the z-score fusion (0 = dense)"
    )
    budget_ms: float | None = Field(None, gt=0, le=600_000, description="latency budget")
    filter: SearchFilter | None = None
    history: list[TurnIn] | None = Field(
        None,
        max_length=1000,
        description="earlier turns of a conversation (as in POST /ask): a follow-up query is "
        "made stand-alone from them; `searched_query` says what was searched",
    )
    rewrite: bool | None = Field(None, description="false: search the query as given")


CHUNK_ID = (
    "the chunk's opaque id (a hash of its document and span; the id of the document's chunk "
    "listing)"
)


class PassageOut(BaseModel):
    chunk_id: str = Field(description=CHUNK_ID)
    document_id: str
    filename: str
    ordinal: int
    text: str
    start_char: int
    end_char: int
    score: float
    dense_score: float | None
    keyword_score: float | None
    metadata: dict[str, Any]

    @classmethod
    def of(cls, p: Passage) -> PassageOut:
        """The passage as clients see it: its opaque uid as its chunk id, never the row id (a
        counter every tenant moves)."""
        fields = {k: v for k, v in vars(p).items() if k != "uid"}
        return cls(**{**fields, "chunk_id": p.uid})


def passages_out(passages: Sequence[Passage]) -> list[PassageOut]:
    return [PassageOut.of(p) for p in passages]


class IndexInfo(BaseModel):
    kind: str
    count: int
    watermark: int | None = Field(
        None,
        description="the change-log position the index has applied: admin keys only (it "
        "moves with every tenant's writes)",
    )
    building: bool
    stale: bool

    @classmethod
    def of(cls, state: IndexState, *, admin: bool) -> IndexInfo:
        return cls(
            kind=state.kind,
            count=state.count,
            watermark=state.watermark if admin else None,
            building=state.building,
            stale=state.stale,
        )


class SearchOut(BaseModel):
    passages: list[PassageOut]
    knobs: dict[str, Any] = Field(description="the knobs actually used")
    timings_ms: dict[str, float]
    degraded: bool
    degradations: list[str]
    over_budget: bool = Field(description="the search took longer than its budget")
    partial: bool = Field(description="the index is still building: results cover what is indexed")
    index: IndexInfo
    searched_query: str = Field(description="what was searched: the query, or with `history` "
                                "a follow-up made stand-alone")  # fmt: skip


class RebuildIn(Request):
    kind: IndexKind | None = None
    params: IndexParams | None = Field(None, description="for `kind`, which they need")

    @model_validator(mode="after")
    def _params_need_a_kind(self) -> RebuildIn:
        if self.params is not None and self.kind is None:
            raise ValueError("params need the kind they are for: send `kind` with them")
        return self


class SearchDefaultsIn(Request):
    """A collection's defaults for searches and answers (a request's own values win)."""

    k: int | None = Field(None, ge=1, le=1000)
    ef_search: int | None = Field(None, ge=1, le=10_000)
    nprobe: int | None = Field(None, ge=1, le=65_536)
    exact: bool | None = None
    hybrid: float | None = Field(None, ge=0, le=1)
    budget_ms: float | None = Field(None, gt=0, le=600_000)
    kv_reuse: Literal["blend", "prefix", "off"] | None = Field(
        None, description="answers: how prompt KV is reused (see POST /ask)"
    )
    mode: Literal["generate", "extractive"] | None = Field(
        None, description="answers: generated or extracted (see POST /ask)"
    )


class WarmOut(BaseModel):
    passages: int = Field(description="chunks queued to be computed into the passage cache")


class TuningPoint(BaseModel):
    knob: str | None = Field(description='"ef_search", "nprobe", or null for exact kinds')
    value: int | None
    recall: float
    p50_ms: float
    p99_ms: float


class TuningOut(BaseModel):
    """The last `rag tune` measurements of a collection, and its current search defaults."""

    collection_id: str
    kind: str
    k: int
    queries: int
    target_recall: float
    budget_ms: float | None
    points: list[TuningPoint]
    chosen: TuningPoint | None
    applied: bool
    measured_at: float | None
    search_defaults: dict[str, Any]

    @classmethod
    def of(cls, report: TuneReport, search_defaults: dict[str, Any] | None) -> TuningOut:
        """The report as clients see it, with the knobs searches use now."""
        return cls(**asdict(report), search_defaults=dict(search_defaults or {}))
