"""A grounded answer, top to bottom: admit → retrieve → threshold → evidence → prompt →
generate (or extract) → cite.

One deadline covers the request: retrieval may use a share of it, generation the rest, and an
answer still being written when it passes stops with finish reason ``deadline``. Overload is
refused before any work (the generator is full: Overloaded, HTTP 429). Citations are mapped
by the server from the answer's ``[n]`` markers and its sentences, only to passages that were
given to the model and that SQL says the caller may still see, right before they are cited
(rag.answer.cite).

Before any generation, the passages must hold the question's names and enough of its terms
(rag.answer.extract.evidence); otherwise the answer says the documents do not contain it
(finish reason ``no_evidence``). The extractive mode answers with quoted passage sentences and
never touches the generator.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from rag.answer import prompt as prompts
from rag.answer.cite import chooser
from rag.answer.extract import evidence, extract
from rag.answer.generate import Prepared, ReviewOptions, admit, start
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

WORDING = prompts.WORDINGS
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
    mode: Mode | None = None  # None: the collection's default, else the service's
    # None: AskSettings' defaults for grounded answers (what the request did not set).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None


Mode = Literal["generate", "extractive"]
KV_REUSE: tuple[KvReuse, ...] = ("blend", "prefix", "off")
MODES: tuple[Mode, ...] = ("generate", "extractive")
T = TypeVar("T", bound=str)


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
    """Everything up to a running generation (or an extracted answer). Raises the domain's
    errors (404, 422, 429) before a response has started."""
    settings = services.settings.ask
    check(req, settings)
    t0 = time.perf_counter()
    engine: GenerationBackend | None = None
    if req.mode != "extractive":  # an extractive answer never needs the generator
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
    mode = _chosen(req.mode, result.saved.get("mode"), MODES, services.settings.ask.mode)
    if mode == "generate" and engine is None:
        engine = await asyncio.to_thread(lambda: services.engine)
        admit(engine)
    prep = answer_from(
        engine, settings, req, relevant, tenant_id=tenant_id, collection_id=collection_id,
        search=result, deadline=deadline, timings=timings, request_id=request_id, mode=mode,
        kv_reuse=_chosen(req.kv_reuse, result.saved.get("kv_reuse"), KV_REUSE,
                         services.settings.engine.kv_reuse),  # fmt: skip
    )  # fmt: skip
    prep.timings_ms["admit_to_submit"] = _ms(t0)
    return prep


def answer_from(
    engine: GenerationBackend | None,
    settings: AskSettings,
    req: AskRequest,
    passages: list[Passage],
    *,
    tenant_id: str = "",
    collection_id: str = "",
    search: SearchResult | None = None,
    deadline: Deadline | None = None,
    timings: dict[str, float] | None = None,
    request_id: str | None = None,
    mode: Mode = "generate",
    kv_reuse: KvReuse = "blend",
) -> Prepared:
    """From the passages retrieved (strongest first) to a running generation, an extracted
    answer, or a refusal when they hold no evidence for the question. Call from the event
    loop (the engine's stream is bound to it); `engine` may be None in extractive mode."""
    deadline = deadline or Deadline.after_ms(None)
    timings = {} if timings is None else timings
    request_id = request_id or "ask-" + uuid.uuid4().hex

    def canned(text: str, reason: str) -> Prepared:
        return Prepared(
            tenant_id, collection_id, [], search, deadline, timings, request_id, None,
            canned=text, canned_reason=reason, mode=mode,
        )  # fmt: skip

    t = time.perf_counter()
    if settings.evidence_coverage is not None:
        found = evidence(req.question, passages)
        timings["evidence"] = _ms(t)
        if not found.answerable(settings.evidence_coverage):
            return canned(NOT_FOUND, "no_evidence")
    review = ReviewOptions(
        settings.attribution, settings.support_threshold,
        WORDING[settings.prompt].sentences(),
    )  # fmt: skip
    if mode == "extractive":
        t = time.perf_counter()
        extracted = extract(
            req.question, passages, max_sentences=settings.extract_sentences,
            max_words=settings.extract_words, min_support=settings.extract_min_support,
        )  # fmt: skip
        timings["extract"] = _ms(t)
        if not extracted.quotes:
            return canned(NOT_FOUND, "no_evidence")
        return Prepared(
            tenant_id, collection_id, passages, search, deadline, timings, request_id, None,
            extracted=extracted, mode=mode, review=review,
        )  # fmt: skip

    assert engine is not None  # the generate mode is admitted before it gets here
    t = time.perf_counter()
    params = grounded_params(req, settings)
    max_tokens = params.max_tokens or settings.default_max_tokens
    context = _context_tokens(engine)
    built = prompts.build(
        req.question, passages, context_tokens=context, max_tokens=max_tokens,
        count=engine.count_tokens, salt=tenant_id, kv_reuse=kv_reuse,
        wording=WORDING[settings.prompt],
    )  # fmt: skip
    timings["prompt"] = _ms(t)
    if built.tokens + max_tokens > context:
        raise Invalid("the question and max_tokens do not fit the model's context")
    if settings.cite_mask:
        steer = chooser(passages[: built.given]) if settings.cite_steer else None
        params = replace(params, cite_passages=built.given, cite_choice=steer)
    stream = start(engine, built.prompt, params, request_id, cache_salt=tenant_id)
    return Prepared(
        tenant_id, collection_id, passages[: built.given], search, deadline, timings,
        request_id, stream, submitted_at=time.perf_counter(), prompt_tokens=built.tokens,
        mode=mode, review=review, stop_repetition=params.stop_repetition,
    )  # fmt: skip


def grounded_params(req: AskRequest, settings: AskSettings) -> SamplingParams:
    """The request's sampling, with the service's grounded-answer defaults where it set none."""

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    params = req.params
    return replace(
        params,
        max_tokens=params.max_tokens or settings.default_max_tokens,
        frequency_penalty=pick(req.frequency_penalty, settings.frequency_penalty),
        presence_penalty=pick(req.presence_penalty, settings.presence_penalty),
        repetition_penalty=pick(req.repetition_penalty, settings.repetition_penalty),
        stop_repetition=settings.stop_repetition,
    )


def _chosen(requested: T | None, saved: object, allowed: tuple[T, ...], default: T) -> T:
    """The request's value, else the collection's saved default (when it is one of
    `allowed`), else the service's."""
    if requested is not None:
        return requested
    for value in allowed:
        if saved == value:
            return value
    return default


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
