"""Bodies of the ask route and of the OpenAI-compatible routes. Requests forbid unknown fields."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag.api.schemas import INT_MAX, NOT_BLANK, Request
from rag.api.schemas_search import CHUNK_ID, PassageOut, SearchFilter, TurnIn
from rag.engine.protocol import KvReuse
from rag.engine.sequence import Usage
from rag.retrieve import Passage

# The engine scans every stop string at every token: a few short ones only.
StopString = Annotated[str, Field(min_length=1, max_length=64)]
MAX_STOPS = 8
# The engine takes seeds below 2**63; requests state the integers JSON readers hold exactly.
SEED_MAX = INT_MAX

# ---------------------------------------------------------------- ask

# The most turns a body may state; the service's own bound (RAG_ASK__MAX_HISTORY_TURNS, and
# RAG_ASK__MAX_HISTORY_CHARS for their text) answers 413 below it.
MAX_HISTORY = 1000


History = Annotated[
    list[TurnIn],
    Field(
        max_length=MAX_HISTORY,
        description="the conversation's earlier turns, oldest first: a follow-up is made a "
        "stand-alone question from them, and the prompt carries the latest (413 past "
        "RAG_ASK__MAX_HISTORY_TURNS turns or RAG_ASK__MAX_HISTORY_CHARS characters)",
    ),
]
REWRITE = (
    "rewrite a follow-up into a stand-alone question before searching (the final event's "
    "`searched_query` says what was searched); false searches the question as asked. None: "
    "the service's (RAG_ASK__REWRITE)"
)


class AskIn(Request):
    question: str = Field(min_length=1, max_length=4000, pattern=NOT_BLANK)
    history: History | None = None
    conversation_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="a stored conversation of this collection: its turns are the history, "
        "and this turn is added to it",
    )
    rewrite: bool | None = Field(None, description=REWRITE)
    # retrieval knobs, as in the search route
    k: int | None = Field(None, ge=1, le=200, description="passages to retrieve")
    ef_search: int | None = Field(None, ge=1, le=10_000)
    nprobe: int | None = Field(None, ge=1, le=65_536)
    exact: bool | None = None
    hybrid: float | None = Field(
        None,
        ge=0,
        le=1,
        description="keyword (BM25) weight in the fusion; None: the collection's saved default, "
        "else the service's (RAG_ASK__HYBRID)",
    )
    filter: SearchFilter | None = None
    # generation
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: list[StopString] | None = Field(None, max_length=MAX_STOPS)
    budget_ms: float | None = Field(None, gt=0, le=600_000, description="whole-request budget")
    kv_reuse: KvReuse | None = Field(
        None,
        description="blend: reuse each passage's cached KV (fastest first token); prefix: only "
        "an identical prompt prefix; off: compute the whole prompt. None: the collection's "
        "default (search-defaults), else the service's (RAG_ENGINE__KV_REUSE)",
    )
    mode: Literal["generate", "extractive"] | None = Field(
        None,
        description="generate: the generator writes the answer; extractive: the passage "
        "sentences that answer best, quoted with their spans, without the generator. None: "
        "the collection's default (search-defaults), else the service's (RAG_ASK__MODE)",
    )
    evidence: Literal["auto", "one", "all"] | None = Field(
        None,
        description="what the generator sees: one: the passage holding the sentence that "
        "answers (the answer is that quote, then one generated sentence shown only when it "
        "agrees with it); all: every passage retrieved (the answer as written, reviewed per "
        "sentence); auto: one for the bundled engine, all for a remote one. None: the "
        "service's (RAG_ASK__EVIDENCE)",
    )
    frequency_penalty: float | None = Field(
        None, ge=-2, le=2, description="OpenAI's, over the answer's tokens; None: RAG_ASK__*"
    )
    presence_penalty: float | None = Field(
        None, ge=-2, le=2, description="OpenAI's, over the answer's tokens; None: RAG_ASK__*"
    )
    repetition_penalty: float | None = Field(
        None, gt=0, le=4, description="transformers' rule, over the answer's tokens"
    )
    stream: bool = False

    @field_validator("question", mode="before")
    @classmethod
    def _not_blank(cls, v: object) -> object:
        if isinstance(v, str) and not v.strip():
            raise ValueError("question is empty")
        return v

    @model_validator(mode="after")
    def _one_history(self) -> AskIn:
        if self.history is not None and self.conversation_id is not None:
            raise ValueError("send `history` or `conversation_id`, not both")
        return self


class CitationOut(BaseModel):
    marker: int = Field(description="the [n] in the answer")
    chunk_id: str = Field(description=CHUNK_ID)
    document_id: str
    filename: str
    start_char: int = Field(description="span of the chunk in the document's extracted text")
    end_char: int
    attributed: bool = Field(
        False, description="true when the answer had no [n] marker and the server attributed it"
    )
    sentences: list[tuple[int, int]] = Field(
        default_factory=list,
        description="the answer's sentences that cite it: [start, end) characters of `answer`",
    )


class QuoteOut(BaseModel):
    marker: int = Field(description="the passage's [n]")
    chunk_id: str = Field(description=CHUNK_ID)
    document_id: str
    text: str = Field(description="the sentence, as in the document")
    start_char: int = Field(description="span of the sentence in the document's extracted text")
    end_char: int
    score: float = Field(description="its share of the question's weighted terms")


class UsageOut(BaseModel):
    prompt_tokens: int
    cached_tokens: int = Field(description="prompt tokens found in the prefix cache")
    reused_tokens: int = Field(
        0, description="prompt tokens of passages whose KV came from the passage cache"
    )
    recomputed_tokens: int = Field(
        0, description="tokens of reused passages recomputed in place (their first tokens)"
    )
    computed_tokens: int = Field(0, description="prompt tokens computed fresh")
    generated_tokens: int

    @classmethod
    def of(cls, u: Usage) -> UsageOut:
        taken = u.cached_prompt_tokens + u.reused_prompt_tokens + u.recomputed_prompt_tokens
        return cls(
            prompt_tokens=u.prompt_tokens,
            cached_tokens=u.cached_prompt_tokens,
            reused_tokens=u.reused_prompt_tokens,
            recomputed_tokens=u.recomputed_prompt_tokens,
            computed_tokens=max(0, u.prompt_tokens - taken),
            generated_tokens=u.completion_tokens,
        )


def opaque(passages: Sequence[Passage], item: Any) -> dict[str, Any]:
    """A citation's or a quote's fields, its chunk id replaced by the opaque one of the
    passage it comes from (never the row id: a counter every tenant moves)."""
    uids = {p.chunk_id: p.uid for p in passages}
    return {**asdict(item), "chunk_id": uids.get(item.chunk_id, "")}


class AskOut(BaseModel):
    answer_id: str | None = Field(
        None,
        description="what POST /v1/answers/{answer_id}/feedback rates (null when answers are "
        "not recorded: quality.enabled off)",
    )
    answer: str
    passages: list[PassageOut] = Field(description="the passages given to the model, [1] first")
    citations: list[CitationOut]
    usage: UsageOut
    timings_ms: dict[str, float]
    finish_reason: str = Field(
        description="stop | length | repetition (the answer began repeating itself) | deadline "
        "| cancelled | error | no_passages (nothing relevant) | no_evidence (the passages lack "
        "the question's names or terms; nothing generated) | not_indexed"
    )
    answer_source: str = Field(
        "generated",
        description="generated: the generator wrote the answer (with evidence one: a checked "
        "sentence follows the quote); quoted: the answer is sentences of the documents only "
        "(the extractive mode, or a generated sentence that failed its check); refused: the "
        "documents do not answer",
    )
    mode: str = Field("generate", description="generate | extractive")
    unsupported: list[tuple[int, int]] = Field(
        default_factory=list,
        description="sentences of `answer` no given passage supports ([start, end) characters): "
        "uncited, not facts from the documents",
    )
    echoed: list[tuple[int, int]] = Field(
        default_factory=list, description="sentences of `answer` that repeat the instructions"
    )
    quotes: list[QuoteOut] = Field(
        default_factory=list, description="the sentences quoted (extractive, or evidence one)"
    )
    repeated: tuple[int, int] | None = Field(
        None,
        description="finish reason repetition: [start, end) of the streamed text that repeated "
        "what it had said, left out of `answer`",
    )
    knobs: dict[str, Any] = Field(default_factory=dict)
    degradations: list[str] = Field(default_factory=list)
    partial: bool = False
    searched_query: str | None = Field(
        None,
        description="the question as searched and answered: a follow-up made stand-alone "
        "from the conversation, else the question as asked",
    )
    rewritten: bool = Field(False, description="searched_query differs from the question")
    conversation_id: str | None = Field(None, description="the conversation this turn joined")


# ---------------------------------------------------------------- OpenAI-compatible


# Plain chat tokenizes every message: bounded per message and in total (the total is also
# checked against ask.max_chat_chars before anything is tokenized).
MAX_MESSAGE_CHARS = 32_000
MAX_MESSAGES_CHARS = 64_000
MAX_MESSAGES = 256
_VISIBLE = re.compile(NOT_BLANK)
# JSON Schema of a message with visible text from the user (`contains` of `messages`).
USER_TURN: dict[str, Any] = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"const": "user"},
        "content": {
            "anyOf": [
                {"type": "string", "pattern": NOT_BLANK},
                {
                    "type": "array",
                    "contains": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {
                            "type": {"const": "text"},
                            "text": {"type": "string", "pattern": NOT_BLANK},
                        },
                    },
                },
            ]
        },
    },
}


class ContentPart(BaseModel):
    # Other part kinds (images, audio) carry fields of their own: accepted and ignored.
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str = Field(min_length=1, max_length=32)
    text: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)


class ChatMessage(Request):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: (
        Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)]
        | Annotated[list[ContentPart], Field(max_length=32)]
        | None
    ) = None
    name: str | None = Field(None, max_length=64)

    def has_text(self) -> bool:
        """Visible text, in the content or in one of its text parts (USER_TURN says the same)."""
        if isinstance(self.content, str):
            return _VISIBLE.match(self.content) is not None
        return any(
            p.type == "text" and p.text is not None and _VISIBLE.match(p.text) is not None
            for p in self.content or ()
        )

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
    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description=f"at most {MAX_MESSAGES_CHARS} characters of text in all, and a user "
        "message with text among them (the last such one is the question)",
        json_schema_extra={"contains": USER_TURN},
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")
    user: str | None = Field(None, max_length=256)
    # over the answer's tokens, as OpenAI defines them; None: 0, or for a collection the
    # service's grounded-answer defaults (RAG_ASK__*)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    top_k: int | None = Field(None, ge=0, le=1000, description="0: off")
    cache_salt: str | None = Field(
        None,
        max_length=256,
        description="vLLM's prefix-cache salt, accepted so that another ragserve (or any "
        "client written for vLLM) can use this one as its generator; this server's caches are "
        "salted by the caller's tenant already",
    )
    # ragserve extensions (the openai client sends them with extra_body)
    k: int | None = Field(None, ge=1, le=200)
    budget_ms: float | None = Field(None, gt=0, le=600_000)
    mode: Literal["generate", "extractive"] | None = Field(None, description="as in /ask")
    rewrite: bool | None = Field(None, description=REWRITE)

    @model_validator(mode="after")
    def _bounded_text(self) -> ChatCompletionIn:
        if self.question() is None:
            raise ValueError("messages: a user message with text is needed")
        total = sum(len(m.text()) for m in self.messages)
        if total > MAX_MESSAGES_CHARS:
            raise ValueError(
                f"messages hold {total} characters of text; the limit is {MAX_MESSAGES_CHARS}"
            )
        return self

    def question(self) -> str | None:
        """The text of the last user message that has some (what a grounded answer answers)."""
        for m in reversed(self.messages):
            if m.role == "user" and m.has_text():
                return m.text()
        return None

    def history(self) -> list[tuple[str, str]]:
        """The earlier turns before the question, oldest first: each user message with text
        and the assistant's reply after it (empty when there is none)."""
        turns: list[tuple[str, str]] = []
        last = max(i for i, m in enumerate(self.messages) if m.role == "user" and m.has_text())
        for m in self.messages[:last]:
            if m.role == "user" and m.has_text():
                turns.append((m.text(), ""))
            elif m.role == "assistant" and turns and not turns[-1][1]:
                turns[-1] = (turns[-1][0], m.text())
        return turns

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
