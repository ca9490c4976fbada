"""Bodies of the ask route and of the OpenAI-compatible routes. Requests forbid unknown fields."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag.api.schemas import PassageOut, Request, SearchFilter
from rag.engine.sequence import Usage
from rag.retrieve import Passage

# ---------------------------------------------------------------- ask


class AskIn(Request):
    question: str = Field(min_length=1, max_length=4000)
    # retrieval knobs, as in the search route
    k: int | None = Field(None, ge=1, le=200, description="passages to retrieve")
    ef_search: int | None = Field(None, ge=1, le=10_000)
    nprobe: int | None = Field(None, ge=1, le=65_536)
    exact: bool | None = None
    hybrid: float | None = Field(None, ge=0, le=1)
    filter: SearchFilter | None = None
    # generation
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] | None = Field(None, max_length=8)
    budget_ms: float | None = Field(None, gt=0, le=600_000, description="whole-request budget")
    stream: bool = False

    @field_validator("question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("question is empty")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s or len(s) > 64 for s in v):
            raise ValueError("stop strings must be 1-64 characters")
        return v


class CitationOut(BaseModel):
    marker: int = Field(description="the [n] in the answer")
    chunk_id: int
    document_id: str
    filename: str
    start_char: int = Field(description="span of the chunk in the document's extracted text")
    end_char: int
    attributed: bool = Field(
        False, description="true when the answer had no [n] marker and the server attributed it"
    )


class UsageOut(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int

    @classmethod
    def of(cls, u: Usage) -> UsageOut:
        return cls(
            prompt_tokens=u.prompt_tokens,
            cached_tokens=u.cached_prompt_tokens,
            generated_tokens=u.completion_tokens,
        )


def passages_out(passages: Sequence[Passage]) -> list[PassageOut]:
    return [PassageOut(**asdict(p)) for p in passages]


class AskOut(BaseModel):
    answer: str
    passages: list[PassageOut] = Field(description="the passages given to the model, [1] first")
    citations: list[CitationOut]
    usage: UsageOut
    timings_ms: dict[str, float]
    finish_reason: str = Field(
        description="stop | length | deadline | cancelled | error | no_passages | not_indexed"
    )
    knobs: dict[str, Any] = Field(default_factory=dict)
    degradations: list[str] = Field(default_factory=list)
    partial: bool = False


# ---------------------------------------------------------------- OpenAI-compatible


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(Request):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(Request):
    include_usage: bool = False


class ChatCompletionIn(Request):
    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")
    user: str | None = None
    # ignored, accepted so that ordinary clients work
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = Field(None, ge=0)
    # ragserve extensions (the openai client sends them with extra_body)
    k: int | None = Field(None, ge=1, le=200)
    budget_ms: float | None = Field(None, gt=0, le=600_000)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    name: str | None = Field(None, description="the collection's name, for collections")
    kind: Literal["collection", "generator"]
    collection_id: str | None = Field(
        None, description="for collections: the id (`model` accepts it as well as `id`)"
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]
