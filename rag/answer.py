"""A grounded answer, top to bottom: admit → retrieve → threshold → prompt → generate → cite.

One deadline covers the request: retrieval may use a share of it, generation the rest, and an
answer still being written when it passes stops with finish reason ``deadline``. Overload is
refused before any work (the engine's waiting queue is full: Overloaded, HTTP 429). Citations
are mapped by the server from the answer's ``[n]`` markers, only to passages that were given to
the model and that SQL says the caller may still see, right before they are cited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy import select

from rag import prompt as prompts
from rag.db import repo
from rag.db.models import Chunk, Document
from rag.deadline import Deadline
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    InvalidRequest,
    SamplingParams,
    TokenEvent,
)
from rag.errors import Invalid, Overloaded
from rag.retrieve import Filter, Knobs, Passage, SearchResult

if TYPE_CHECKING:
    from rag.engine.engine import GenerationBackend
    from rag.services import Services

log = logging.getLogger(__name__)

NOT_FOUND = "The documents do not contain an answer to this question."
NOTHING_INDEXED = "Nothing is indexed in this collection yet, so there is nothing to answer from."
MARKER = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]")
# How long a cancelled generation may take to report its usage before we stop waiting.
CANCEL_GRACE_S = 0.5


@dataclass(frozen=True)
class AskRequest:
    question: str
    knobs: Knobs = Knobs()
    filter: Filter | None = None
    params: SamplingParams = SamplingParams()
    budget_ms: float | None = None


@dataclass(frozen=True)
class Citation:
    marker: int
    chunk_id: int
    document_id: str
    filename: str
    start_char: int
    end_char: int
    # False: the answer wrote [n]. True: it wrote no marker, and the server attributed it to a
    # given passage that most of the answer's words come from.
    attributed: bool = False


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0


@dataclass
class Final:
    answer: str
    citations: list[Citation]
    usage: Usage
    timings_ms: dict[str, float]
    finish_reason: str  # stop | length | deadline | cancelled | no_passages | not_indexed


@dataclass
class Prepared:
    """What exists before the first token: the passages given and the running generation."""

    tenant_id: str
    collection_id: str
    passages: list[Passage]  # those given to the model, numbered from 1
    search: SearchResult | None
    deadline: Deadline
    timings_ms: dict[str, float]
    request_id: str
    stream: AsyncIterator[TokenEvent] | None  # None: answered without the generator
    canned: str | None = None
    canned_reason: str | None = None
    submitted_at: float = 0.0
    prompt_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Answerer:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.settings = services.settings.ask

    # ------------------------------------------------------------------ before any work

    def admit(self, engine: GenerationBackend) -> None:
        """Refuse at once when the engine's waiting queue is full (HTTP 429)."""
        max_waiting = getattr(engine, "max_waiting", None)
        if max_waiting is None:
            return
        waiting = engine.metrics().waiting
        if waiting >= max_waiting:
            log.warning("ask refused: %d requests waiting (max %d)", waiting, max_waiting)
            raise Overloaded(f"the generator has {waiting} requests waiting", retry_after_s=1.0)

    def check(self, req: AskRequest) -> None:
        if not req.question.strip():
            raise Invalid("question is empty")
        if len(req.question) > self.settings.max_question_chars:
            raise Invalid(f"question is longer than {self.settings.max_question_chars} characters")
        max_tokens = req.params.max_tokens
        if max_tokens is not None and not 1 <= max_tokens <= self.settings.max_tokens_limit:
            raise Invalid(f"max_tokens must be between 1 and {self.settings.max_tokens_limit}")

    # ------------------------------------------------------------------ retrieve → prompt → submit

    async def prepare(self, tenant_id: str, collection_id: str, req: AskRequest) -> Prepared:
        """Everything up to a running generation. Raises the domain's errors (404, 422, 429)
        before a response has started."""
        self.check(req)
        t0 = time.perf_counter()
        engine = await anyio.to_thread.run_sync(lambda: self.services.engine)
        self.admit(engine)
        budget = req.budget_ms if req.budget_ms is not None else self.settings.default_budget_ms
        deadline = Deadline.after_ms(budget)
        timings: dict[str, float] = {}
        request_id = "ask-" + uuid.uuid4().hex
        knobs = req.knobs
        if knobs.k is None:
            knobs = Knobs(**{**knobs.__dict__, "k": self.settings.default_k})
        retrieve_deadline = (
            Deadline(deadline.started + budget / 1000.0 * self.settings.retrieve_share)
            if budget is not None
            else None
        )

        t = time.perf_counter()
        result = await anyio.to_thread.run_sync(
            self.services.retriever.search,
            tenant_id,
            collection_id,
            req.question,
            knobs,
            req.filter,
            retrieve_deadline,
        )
        timings["retrieve"] = _ms(t)
        for stage, ms in result.timings_ms.items():
            timings[f"retrieve.{stage}"] = ms

        def prepared(passages: list[Passage], **kw: Any) -> Prepared:
            return Prepared(
                tenant_id, collection_id, passages, result, deadline, timings, request_id, **kw
            )

        if not result.passages:
            indexed = await anyio.to_thread.run_sync(self._chunk_count, tenant_id, collection_id)
            if indexed == 0:
                return prepared(
                    [], stream=None, canned=NOTHING_INDEXED, canned_reason="not_indexed"
                )
            return prepared([], stream=None, canned=NOT_FOUND, canned_reason="no_passages")
        relevant = [
            p for p in result.passages if _relevance(p) >= self.settings.relevance_threshold
        ]
        if not relevant:
            return prepared([], stream=None, canned=NOT_FOUND, canned_reason="no_passages")

        t = time.perf_counter()
        params = req.params
        if params.max_tokens is None:
            params = SamplingParams(
                **{**params.__dict__, "max_tokens": self.settings.default_max_tokens}
            )
        built = prompts.build(
            req.question,
            relevant,
            context_tokens=_context_tokens(engine),
            max_tokens=params.max_tokens or self.settings.default_max_tokens,
            count=_counter(engine),
        )
        timings["prompt"] = _ms(t)
        if built.tokens + (params.max_tokens or 0) > _context_tokens(engine):
            raise Invalid("the question and max_tokens do not fit the model's context")
        given = relevant[: built.given]
        try:
            stream = engine.submit(built.messages, params, request_id)
        except EngineOverloaded as exc:
            raise Overloaded(str(exc), retry_after_s=exc.retry_after_s) from None
        except InvalidRequest as exc:
            raise Invalid(str(exc)) from None
        timings["admit_to_submit"] = _ms(t0)
        return prepared(given, stream=stream, submitted_at=time.perf_counter(),
                        prompt_tokens=built.tokens)  # fmt: skip

    def _chunk_count(self, tenant_id: str, collection_id: str) -> int:
        with self.services.db.read() as session:
            repo.get_collection(session, tenant_id, collection_id)
            return repo.chunk_count(session, collection_id)

    # ------------------------------------------------------------------ generate

    async def tokens(self, prep: Prepared) -> AsyncGenerator[str | Final, None]:
        """The answer's text as it is written, then one Final. Closing this iterator early
        (a client that went away) cancels the generation and frees its KV blocks."""
        if prep.stream is None:
            text = prep.canned or NOT_FOUND
            yield text
            yield Final(text, [], Usage(), prep.timings_ms, prep.canned_reason or "no_passages")
            return
        engine = self.services.engine
        stream = prep.stream
        pieces: list[str] = []
        usage = Usage(prompt_tokens=prep.prompt_tokens)
        reason = "stop"
        first_at: float | None = None
        engine_stages: dict[str, float] = {}
        links = _ImageFilter()
        it = stream.__aiter__()
        finished = False
        try:
            while True:
                timeout = None
                if prep.deadline.bounded:
                    timeout = max(0.0, prep.deadline.remaining_ms() / 1000.0)
                try:
                    ev = await asyncio.wait_for(it.__anext__(), timeout)
                except StopAsyncIteration:
                    finished = True
                    break
                except TimeoutError:
                    reason = "deadline"
                    engine.cancel(prep.request_id)
                    usage = await self._usage_after_cancel(it, usage)
                    finished = True
                    break
                if ev.text:
                    if first_at is None:
                        first_at = time.perf_counter()
                    shown = links.feed(ev.text)
                    if shown:
                        pieces.append(shown)
                        yield shown
                if ev.finished:
                    finished = True
                    reason = str(ev.finish_reason)
                    if ev.usage is not None:
                        usage = Usage(
                            ev.usage.prompt_tokens,
                            ev.usage.cached_prompt_tokens,
                            ev.usage.completion_tokens,
                        )
                        # The engine's split of the time to first token, when it gives one.
                        split = (("queue", ev.usage.queue_ms), ("prefill", ev.usage.prefill_ms))
                        engine_stages = {stage: ms for stage, ms in split if ms is not None}
                    break
        except EngineError as exc:
            log.warning("generation %s failed: %s", prep.request_id, type(exc).__name__)
            reason = "error"
            finished = True
        finally:
            if not finished:  # the caller went away: free the KV blocks now
                engine.cancel(prep.request_id)
                aclose = getattr(it, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
        tail = links.flush()
        if tail:
            pieces.append(tail)
            yield tail
        now = time.perf_counter()
        timings = dict(prep.timings_ms)
        timings.update(engine_stages)
        if first_at is not None:
            timings["first_token"] = round((first_at - prep.submitted_at) * 1000.0, 3)
        timings["generate"] = round((now - prep.submitted_at) * 1000.0, 3)
        answer = "".join(pieces)
        t = time.perf_counter()
        citations = await anyio.to_thread.run_sync(self.cite, prep, answer)
        timings["cite"] = _ms(t)
        timings["total"] = round(prep.deadline.elapsed_ms(), 3)
        yield Final(answer, citations, usage, timings, reason)

    @staticmethod
    async def _usage_after_cancel(it: AsyncIterator[TokenEvent], usage: Usage) -> Usage:
        """A cancelled request still reports its usage on its last event; wait briefly."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_GRACE_S):
                async for ev in it:
                    if ev.finished and ev.usage is not None:
                        u = ev.usage
                        return Usage(u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens)
        return usage

    # ------------------------------------------------------------------ cite

    def cite(self, prep: Prepared, answer: str) -> list[Citation]:
        return cite(self.services, prep.tenant_id, prep.collection_id, prep.passages, answer)


def markers(answer: str) -> list[int]:
    """The passage numbers the answer cites, in order of first appearance."""
    seen: list[int] = []
    for m in MARKER.finditer(answer):
        for part in m.group(1).split(","):
            n = int(part)
            if n not in seen:
                seen.append(n)
    return seen


def cite(
    services: Services,
    tenant_id: str,
    collection_id: str,
    given: Sequence[Passage],
    answer: str,
) -> list[Citation]:
    """Map [n] markers to the passages given, re-checked against SQL right before citing:
    a marker that points nowhere, or to a chunk deleted since or never the caller's, is
    dropped. An answer with no usable marker (small models often write none) is attributed
    to the given passages most of its words come from, flagged as attributed."""
    wanted = [(n, given[n - 1]) for n in markers(answer) if 1 <= n <= len(given)]
    attributed = not wanted
    if attributed:
        wanted = attribute(answer, given)
    if not wanted:
        return []
    ids = {p.chunk_id for _, p in wanted}
    with services.db.read() as session:
        visible = set(
            session.scalars(
                select(Chunk.id)
                .join(Document, Document.id == Chunk.document_id)
                .where(
                    Chunk.id.in_(ids),
                    Chunk.tenant_id == tenant_id,
                    Chunk.collection_id == collection_id,
                    Document.tenant_id == tenant_id,
                    Document.collection_id == collection_id,
                    Document.deleted_at.is_(None),
                )
            )
        )
    return [
        Citation(n, p.chunk_id, p.document_id, p.filename, p.start_char, p.end_char, attributed)
        for n, p in wanted
        if p.chunk_id in visible
    ]


_CONTENT_WORD = re.compile(r"[^\W\d_]{4,}", re.UNICODE)
ATTRIBUTION_MIN_WORDS = 4
ATTRIBUTION_MIN_SHARE = 0.6


def attribute(answer: str, given: Sequence[Passage]) -> list[tuple[int, Passage]]:
    """Given passages (numbered from 1) that supply at least 60% of the answer's content
    words, best first, at most two. Nothing for a short or unsupported answer: a refusal or
    an answer from outside the passages gets no citation rather than a wrong one."""
    words = {w.lower() for w in _CONTENT_WORD.findall(answer)}
    if len(words) < ATTRIBUTION_MIN_WORDS:
        return []
    scored = []
    for n, passage in enumerate(given, start=1):
        share = len(words & {w.lower() for w in _CONTENT_WORD.findall(passage.text)}) / len(words)
        if share >= ATTRIBUTION_MIN_SHARE:
            scored.append((share, n, passage))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [(n, passage) for _, n, passage in scored[:2]]


async def answer(
    services: Services, tenant_id: str, collection_id: str, req: AskRequest
) -> tuple[Prepared, Final]:
    """The whole answer at once (no streaming)."""
    answerer = Answerer(services)
    prep = await answerer.prepare(tenant_id, collection_id, req)
    final: Final | None = None
    async for item in answerer.tokens(prep):
        if isinstance(item, Final):
            final = item
    assert final is not None
    return prep, final


class _ImageFilter:
    """Neutralise markdown images in the streamed answer ("![" → "["), holding back a
    trailing "!" until the next piece shows whether an image starts there."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text = (self._held + text).replace("![", "[")
        self._held = ""
        if text.endswith("!"):
            self._held, text = "!", text[:-1]
        return text

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _relevance(p: Passage) -> float:
    return p.dense_score if p.dense_score is not None else p.score


def _context_tokens(engine: GenerationBackend) -> int:
    return int(getattr(engine, "max_model_len", 8192))


def _counter(engine: GenerationBackend) -> prompts.TokenCounter | None:
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "encode_prompt"):
        return None

    def count(messages: prompts.Messages) -> int:
        return len(tokenizer.encode_prompt(messages))

    return count


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 3)


__all__ = [
    "AskRequest",
    "Answerer",
    "Citation",
    "Final",
    "NOTHING_INDEXED",
    "NOT_FOUND",
    "Prepared",
    "Usage",
    "answer",
    "cite",
    "markers",
]
