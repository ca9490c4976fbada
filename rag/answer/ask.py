"""A grounded answer, top to bottom: admit → retrieve → choose the evidence → answerable? →
quote → generate one checked sentence over the one passage (or extract, or generate over
several) → cite.

One deadline covers the request: retrieval may use a share of it, generation the rest, and an
answer still being written when it passes stops with finish reason ``deadline``. Overload is
refused before any work (the generator is full: Overloaded, HTTP 429).

Evidence first (rag.answer.evidence): the sentence of the retrieved passages that answers the
question is chosen before any generation. When there is none (the passages lack the
question's names, or no sentence holds what it asks for), the answer says the documents do
not contain it, without the generator (answer_source ``refused``). Otherwise, by the
`evidence` setting:

- ``one`` (the bundled model's default): the quote, then one sentence the generator writes
  from that passage alone, shown only when it agrees with the quote (rag.answer.check). The
  prompt is the system instruction, the passage and the question, in that order, so a
  passage's KV is a prefix the engine's cache reuses exactly for any later question over it.
- ``all`` (a remote model's default): the passages in one prompt, the answer streamed as it is
  written and reviewed sentence by sentence.

The extractive mode quotes without the generator.

A follow-up in a conversation (`history`, oldest turn first) is resolved into a stand-alone
question first (rag.answer.history): that is what is retrieved, what the evidence is chosen
and checked for, and the prompt's last question, after the earlier turns; `searched_query`
reports it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import rag.answer.history as histories
import rag.answer.prompt as prompts
from rag.answer.cite import chooser
from rag.answer.evidence import Choice, choose
from rag.answer.extract import extract
from rag.answer.generate import admit, start
from rag.answer.kinds import Generating, Grounded, Quoted, Refused, ReviewOptions
from rag.answer.prepared import NOT_FOUND, Prepared
from rag.answer.units import HEAD_LOOKBACK, Head, starts_in_table, table_head
from rag.answer.vectors import Embed
from rag.db import collections, documents
from rag.deadline import Deadline
from rag.engine.protocol import KvReuse
from rag.engine.sequence import SamplingParams
from rag.errors import Invalid
from rag.knobs import Knobs
from rag.ops.logs import new_id
from rag.retrieve import Filter, Passage, SearchResult

if TYPE_CHECKING:
    from rag.config import AskSettings
    from rag.engine.protocol import GenerationBackend
    from rag.services import Services

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
    evidence: EvidenceUse | None = None  # None: the service's (auto: by the generator)
    # None: AskSettings' defaults for grounded answers (what the request did not set).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    # The conversation's earlier turns, oldest first, and whether a follow-up is rewritten
    # into a stand-alone question (None: AskSettings.rewrite).
    history: tuple[histories.Turn, ...] = ()
    rewrite: bool | None = None


Mode = Literal["generate", "extractive"]
EvidenceUse = Literal["auto", "one", "all"]
KV_REUSE: tuple[KvReuse, ...] = ("blend", "prefix", "off")
MODES: tuple[Mode, ...] = ("generate", "extractive")
T = TypeVar("T", bound=str)
R = TypeVar("R")


class Run(Protocol):
    """Where the blocking steps of an answer run: the API passes its search threads'
    `Pool.run` (tenant lines, 429 past their bounds); elsewhere a plain thread."""

    async def __call__(self, fn: Callable[..., R], /, *args: Any) -> R: ...


def check(req: AskRequest, settings: AskSettings) -> None:
    if not req.question.strip():
        raise Invalid("question is empty")
    if len(req.question) > settings.max_question_chars:
        raise Invalid(f"question is longer than {settings.max_question_chars} characters")
    max_tokens = req.params.max_tokens
    if max_tokens is not None and not 1 <= max_tokens <= settings.max_tokens_limit:
        raise Invalid(f"max_tokens must be between 1 and {settings.max_tokens_limit}")
    histories.check_bounds(req.history, settings.max_history_turns, settings.max_history_chars)


async def prepare(
    services: Services, tenant_id: str, collection_id: str, req: AskRequest,
    run: Run = asyncio.to_thread,
) -> Prepared:  # fmt: skip
    """Everything up to a running generation (or an extracted answer). Raises the domain's
    errors (404, 422, 429) before a response has started. Retrieval, the evidence and the
    prompt run through `run`."""
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
    request_id = "ask-" + new_id()
    rewrite = settings.rewrite if req.rewrite is None else req.rewrite
    resolved = histories.resolve(req.question, req.history, rewrite=rewrite)
    req = replace(req, question=resolved.query)
    knobs = req.knobs if req.knobs.k is not None else req.knobs.with_(k=settings.default_k)
    retrieve_deadline = (
        Deadline(deadline.started + budget / 1000.0 * settings.advanced.retrieve_share)
        if budget is not None
        else None
    )

    t = time.perf_counter()
    result = await run(
        services.retriever.search,
        tenant_id,
        collection_id,
        req.question,
        knobs,
        req.filter,
        retrieve_deadline,
        settings.hybrid,
    )
    timings["retrieve"] = _ms(t)
    for stage, ms in result.timings_ms.items():
        timings[f"retrieve.{stage}"] = ms

    def refused(text: str, reason: str) -> Prepared:
        return Refused(
            tenant_id=tenant_id, collection_id=collection_id, passages=[], search=result,
            deadline=deadline, timings_ms=timings, request_id=request_id, text=text,
            reason=reason, resolved=resolved,
        )  # fmt: skip

    if not result.passages:
        indexed = await run(_chunk_count, services, tenant_id, collection_id)
        if indexed == 0:
            return refused(NOTHING_INDEXED, "not_indexed")
        return refused(NOT_FOUND, "no_passages")
    relevant = [p for p in result.passages if _relevance(p) >= settings.relevance_threshold]
    if not relevant:
        return refused(NOT_FOUND, "no_passages")
    mode = _chosen(req.mode, result.saved.get("mode"), MODES, settings.mode)
    if mode == "generate" and engine is None:
        engine = await asyncio.to_thread(lambda: services.engine)
        admit(engine)
    heads = None
    if any(p.start_char > 0 and starts_in_table(p.text) for p in relevant):
        heads = await run(_table_heads, services, tenant_id, relevant)
    use = req.evidence or settings.evidence
    if use == "auto":
        use = "all" if services.settings.engine.backend == "remote" else "one"
    prep = await answer_from(
        engine, settings, req, relevant, tenant_id=tenant_id, collection_id=collection_id,
        embed=(services.unit_vectors.embed(tenant_id, services.embedder.embed)
               if services.embedder.semantic else None),  # fmt: skip
        search=result, deadline=deadline, timings=timings, request_id=request_id, mode=mode,
        evidence=use, kv_reuse=_chosen(req.kv_reuse, result.saved.get("kv_reuse"), KV_REUSE,
                                       services.settings.engine.kv_reuse),  # fmt: skip
        run=run, heads=heads,
    )  # fmt: skip
    prep.resolved = resolved
    prep.timings_ms["admit_to_submit"] = _ms(t0)
    return prep


async def answer_from(
    engine: GenerationBackend | None,
    settings: AskSettings,
    req: AskRequest,
    passages: list[Passage],
    *,
    embed: Embed | None = None,
    tenant_id: str = "",
    collection_id: str = "",
    search: SearchResult | None = None,
    deadline: Deadline | None = None,
    timings: dict[str, float] | None = None,
    request_id: str | None = None,
    mode: Mode = "generate",
    evidence: Literal["one", "all"] = "one",
    kv_reuse: KvReuse = "prefix",
    run: Run = asyncio.to_thread,
    heads: list[Head | None] | None = None,
) -> Prepared:
    """From the passages retrieved (strongest first) to a running generation, a quote, or a
    refusal when no sentence of them answers the question. Call from the event loop (the
    engine's stream is bound to it); the evidence and the prompt are built in a thread.
    `engine` may be None in extractive mode; `embed` (the embedding model) compares the
    question with the best candidate sentences, when given; `heads`: the header row of the
    table each passage starts inside, if any (`_table_heads`)."""
    deadline = deadline or Deadline.after_ms(None)
    timings = {} if timings is None else timings
    request_id = request_id or "ask-" + new_id()
    base: dict[str, Any] = dict(
        tenant_id=tenant_id, collection_id=collection_id, search=search, deadline=deadline,
        timings_ms=timings, request_id=request_id, mode=mode,
    )  # fmt: skip

    t = time.perf_counter()
    choice = await run(_choice, req.question, passages, embed, heads)
    timings["evidence"] = _ms(t)
    if choice is None or not choice.answerable(
        settings.advanced.min_support, settings.min_similarity
    ):
        return Refused(passages=[], text=NOT_FOUND, reason="no_evidence", **base)
    if mode == "extractive":
        extracted = extract(passages, choice, max_sentences=settings.extract_sentences,
                            max_words=settings.extract_words)  # fmt: skip
        return Quoted(passages=passages, extracted=extracted, **base)

    assert engine is not None  # the generate mode is admitted before it gets here
    params = grounded_params(req, settings)
    if evidence == "one":
        given = [passages[choice.passage]]
        quote = extract(given, replace(choice, passage=0, others=()))
        params = replace(
            params, max_tokens=min(params.max_tokens or 1, settings.advanced.sentence_tokens)
        )
        wording = prompts.ONE
    else:
        given = passages
        wording = prompts.GROUNDED
    t = time.perf_counter()
    turns = histories.prompt_turns(req.history, settings.prompt_turns, settings.prompt_turn_chars)
    built = await run(_prompt, engine, req.question, given, params, tenant_id, kv_reuse, wording,
                      turns)  # fmt: skip
    timings["prompt"] = _ms(t)
    if settings.advanced.cite_mask:
        steer = chooser(given[: built.given]) if settings.advanced.cite_steer else None
        params = replace(params, cite_passages=built.given, cite_choice=steer)
    stream = start(engine, built.prompt, params, request_id, cache_salt=tenant_id)
    running: dict[str, Any] = dict(passages=given[: built.given], generation=stream,
                   submitted_at=time.perf_counter(), prompt_tokens=built.tokens)  # fmt: skip
    if evidence == "one":
        return Grounded(quote=quote, question=req.question, **running, **base)
    review = ReviewOptions(settings.advanced.support_threshold, wording.sentences())
    return Generating(review=review, stop_repetition=params.stop_repetition, **running, **base)


def _choice(
    question: str, passages: list[Passage], embed: Embed | None, heads: list[Head | None] | None
) -> Choice | None:
    dense = [_relevance(p) for p in passages]
    similar = None
    if embed is not None:

        def similar(query: str, texts: list[str]) -> list[float]:
            vectors = embed([query, *texts])  # normalized: a dot product is the cosine
            return [float(v) for v in vectors[1:] @ vectors[0]]

    return choose(question, passages, dense=dense, titles=[p.filename for p in passages],
                  similar=similar, heads=heads)  # fmt: skip


def _table_heads(services: Services, tenant_id: str, passages: list[Passage]) -> list[Head | None]:
    """The header row of the table each passage starts inside, from its document's text
    before it (a chunk cut it off), or None."""
    out: list[Head | None] = []
    with services.db.read() as session:
        for p in passages:
            before = ""
            if p.start_char > 0 and starts_in_table(p.text):
                before = documents.text_before(
                    session, tenant_id, p.document_id, p.start_char, HEAD_LOOKBACK
                )
            out.append(table_head(before) if before else None)
    return out


def _prompt(
    engine: GenerationBackend,
    question: str,
    given: list[Passage],
    params: SamplingParams,
    tenant_id: str,
    kv_reuse: KvReuse,
    wording: prompts.Wording,
    history: list[histories.Turn] | None = None,
) -> prompts.Prompt:
    """The prompt, counted with the engine's tokenizer (in a thread: a long passage takes a
    while to tokenize, and the event loop serves every tenant)."""
    context = _context_tokens(engine)
    max_tokens = params.max_tokens or 0
    built = prompts.build(
        question, given, context_tokens=context, max_tokens=max_tokens,
        count=engine.count_tokens, salt=tenant_id, kv_reuse=kv_reuse, wording=wording,
        history=history or (),
    )  # fmt: skip
    if built.given == 0 or built.tokens + max_tokens > context:
        raise Invalid("the question and max_tokens do not fit the model's context")
    return built


def grounded_params(req: AskRequest, settings: AskSettings) -> SamplingParams:
    """The request's sampling, with the service's grounded-answer defaults where it set none."""

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    params = req.params
    return replace(
        params,
        max_tokens=params.max_tokens or settings.default_max_tokens,
        frequency_penalty=pick(req.frequency_penalty, settings.advanced.frequency_penalty),
        presence_penalty=pick(req.presence_penalty, settings.advanced.presence_penalty),
        repetition_penalty=pick(req.repetition_penalty, settings.advanced.repetition_penalty),
        stop_repetition=settings.advanced.stop_repetition,
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
