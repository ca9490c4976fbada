"""A grounded answer, top to bottom: admit → retrieve → threshold → prompt → generate → cite.

One deadline covers the request: retrieval may use a share of it, generation the rest, and an
answer still being written when it passes stops with finish reason ``deadline``. Overload is
refused before any work (the generator is full: Overloaded, HTTP 429). Citations are mapped
by the server from the answer's ``[n]`` markers, only to passages that were given to the model
and that SQL says the caller may still see, right before they are cited (rag.answer.cite).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rag.answer import prompt as prompts
from rag.answer.generate import Prepared, admit, start
from rag.db import collections
from rag.deadline import Deadline
from rag.engine.protocol import KvReuse
from rag.engine.sequence import SamplingParams
from rag.errors import Invalid
from rag.knobs import Knobs
from rag.retrieve import Filter, Passage, SearchResult

if TYPE_CHECKING:
    from rag.config import AskSettings
    from rag.engine.protocol import GenerationBackend
    from rag.services import Services

NOT_FOUND = "The documents do not contain an answer to this question."
NOTHING_INDEXED = "Nothing is indexed in this collection yet, so there is nothing to answer from."


@dataclass(frozen=True)
class AskRequest:
    question: str
    knobs: Knobs = Knobs()
    filter: Filter | None = None
    params: SamplingParams = SamplingParams()
    budget_ms: float | None = None
    kv_reuse: KvReuse | None = None  # None: the collection's default, else the service's


KV_REUSE = ("blend", "prefix", "off")


def check(req: AskRequest, settings: AskSettings) -> None:
    if not req.question.strip():
        raise Invalid("question is empty")
    if len(req.question) > settings.max_question_chars:
        raise Invalid(f"question is longer than {settings.max_question_chars} characters")
    max_tokens = req.params.max_tokens
    if max_tokens is not None and not 1 <= max_tokens <= settings.max_tokens_limit:
        raise Invalid(f"max_tokens must be between 1 and {settings.max_tokens_limit}")


async def prepare(
    services: Services, tenant_id: str, collection_id: str, req: AskRequest
) -> Prepared:
    """Everything up to a running generation. Raises the domain's errors (404, 422, 429)
    before a response has started."""
    settings = services.settings.ask
    check(req, settings)
    t0 = time.perf_counter()
    engine = await asyncio.to_thread(lambda: services.engine)
    admit(engine)
    budget = req.budget_ms if req.budget_ms is not None else settings.default_budget_ms
    deadline = Deadline.after_ms(budget)
    timings: dict[str, float] = {}
    request_id = "ask-" + uuid.uuid4().hex
    knobs = req.knobs if req.knobs.k is not None else req.knobs.with_(k=settings.default_k)
    retrieve_deadline = (
        Deadline(deadline.started + budget / 1000.0 * settings.retrieve_share)
        if budget is not None
        else None
    )

    t = time.perf_counter()
    result = await asyncio.to_thread(
        services.retriever.search,
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

    def canned(text: str, reason: str) -> Prepared:
        return Prepared(
            tenant_id, collection_id, [], result, deadline, timings, request_id, None,
            canned=text, canned_reason=reason,
        )  # fmt: skip

    if not result.passages:
        indexed = await asyncio.to_thread(_chunk_count, services, tenant_id, collection_id)
        if indexed == 0:
            return canned(NOTHING_INDEXED, "not_indexed")
        return canned(NOT_FOUND, "no_passages")
    relevant = [p for p in result.passages if _relevance(p) >= settings.relevance_threshold]
    if not relevant:
        return canned(NOT_FOUND, "no_passages")

    t = time.perf_counter()
    params = req.params
    if params.max_tokens is None:
        params = replace(params, max_tokens=settings.default_max_tokens)
    max_tokens = params.max_tokens or settings.default_max_tokens
    context = _context_tokens(engine)
    built = prompts.build(
        req.question, relevant, context_tokens=context, max_tokens=max_tokens,
        count=engine.count_tokens, salt=tenant_id, kv_reuse=_kv_reuse(services, req, result),
    )  # fmt: skip
    timings["prompt"] = _ms(t)
    if built.tokens + max_tokens > context:
        raise Invalid("the question and max_tokens do not fit the model's context")
    stream = start(engine, built.prompt, params, request_id, cache_salt=tenant_id)
    timings["admit_to_submit"] = _ms(t0)
    return Prepared(
        tenant_id, collection_id, relevant[: built.given], result, deadline, timings, request_id,
        stream, submitted_at=time.perf_counter(), prompt_tokens=built.tokens,
    )  # fmt: skip


def _kv_reuse(services: Services, req: AskRequest, result: SearchResult) -> KvReuse:
    """The request's kv_reuse, else the collection's saved default, else the service's."""
    saved = result.saved.get("kv_reuse")
    if req.kv_reuse is not None:
        return req.kv_reuse
    if saved in KV_REUSE:
        return saved  # type: ignore[no-any-return]
    return services.settings.engine.kv_reuse


def _chunk_count(services: Services, tenant_id: str, collection_id: str) -> int:
    with services.db.read() as session:
        collections.get(session, tenant_id, collection_id)
        return collections.chunk_count(session, collection_id)


def _relevance(p: Passage) -> float:
    return p.dense_score if p.dense_score is not None else p.score


def _context_tokens(engine: GenerationBackend) -> int:
    """The context the prompt must fit; a backend that does not say (a remote server) is
    given room for any prompt the question limits allow."""
    return engine.context_tokens or (1 << 30)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 3)
