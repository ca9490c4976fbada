"""From a submitted generation to the final event: the one loop every answer goes through.

`start` admits and submits (overload refused before any work: HTTP 429); `tokens` drains the
engine's stream as text pieces, then one `Final`: the deadline stops it (finish reason
`deadline`), a client that goes away cancels it and frees its KV blocks, markdown images are
neutralised on the way, and at the end each sentence is cited or reported unsupported or
echoed (rag.answer.cite), the citations checked against SQL. Nothing is held back for that:
the stream is the engine's, and the review is in the final event. An extracted answer
(rag.answer.extract) goes the same way, without the generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rag.answer.cite import (
    Attribution,
    Citation,
    Review,
    Span,
    Visible,
    citations,
    review,
    visible_in,
)
from rag.answer.extract import Extracted, Quote
from rag.answer.loops import cut, repeat_start, repeated_tail
from rag.deadline import Deadline
from rag.engine.protocol import GenerationBackend, Prompt
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    InvalidRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)
from rag.errors import Invalid, Overloaded
from rag.retrieve import Passage, SearchResult

if TYPE_CHECKING:
    from rag.services import Services

log = logging.getLogger(__name__)

# How long a cancelled generation may take to report its usage before we stop waiting.
CANCEL_GRACE_S = 0.5
NO_USAGE = Usage(0, 0, 0)


@dataclass(frozen=True)
class ReviewOptions:
    """How the answer's sentences are checked (AskSettings): rag.answer.cite.review."""

    how: Attribution = "sentence"
    threshold: float = 0.5
    instruction: tuple[str, ...] = ()  # the system instruction's sentences


@dataclass
class Prepared:
    """What exists before the first token: the passages given and the running generation."""

    tenant_id: str
    collection_id: str  # "" for plain chat
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
    mode: str = "generate"  # generate | extractive
    extracted: Extracted | None = None  # the extractive mode's answer
    review: ReviewOptions = ReviewOptions()
    stop_repetition: bool = False  # stop a sentence that begins as an earlier one (loops.py)


@dataclass
class Final:
    answer: str
    citations: list[Citation]
    usage: Usage
    timings_ms: dict[str, float]
    # stop | length | repetition | deadline | cancelled | error | no_passages | no_evidence
    # | not_indexed
    finish_reason: str
    unsupported: list[Span] = field(default_factory=list)  # sentences no passage supports
    echoed: list[Span] = field(default_factory=list)  # sentences of the system instruction
    quotes: list[Quote] = field(default_factory=list)  # the extractive mode's sentences
    # finish reason "repetition": where the streamed text's repeated tail lies ([start, end)
    # of the concatenated pieces; already streamed, a client may hide it). `answer` leaves it
    # out.
    repeated: Span | None = None


def admit(engine: GenerationBackend) -> None:
    """Refuse at once when the generator is full (HTTP 429)."""
    if not engine.has_room():
        log.warning("generation refused: the generator is full")
        raise Overloaded("the generator's queue is full", retry_after_s=1.0)


def start(
    engine: GenerationBackend,
    prompt: Prompt,
    params: SamplingParams,
    request_id: str,
    *,
    cache_salt: str | None = None,
) -> AsyncIterator[TokenEvent]:
    """Submit, with the engine's refusals as the domain's errors (429, 422). `cache_salt`
    (the tenant) keeps the engine's prefix cache from matching another tenant's prompts."""
    try:
        return engine.submit(prompt, params, request_id, cache_salt=cache_salt)
    except EngineOverloaded as exc:
        raise Overloaded(str(exc), retry_after_s=exc.retry_after_s) from None
    except InvalidRequest as exc:
        raise Invalid(str(exc)) from None


def cancel(services: Services, prep: Prepared) -> None:
    """Free a generation's KV blocks now; harmless when it already finished."""
    if prep.stream is not None:
        services.engine.cancel(prep.request_id)


async def tokens(services: Services, prep: Prepared) -> AsyncGenerator[str | Final, None]:
    """The answer's text as it is written, then one Final (with the time of each stage).
    Closing this iterator early (a client that went away) cancels the generation."""
    engine = services.engine if prep.stream is not None else None
    visible = visible_in(services.db, prep.tenant_id, prep.collection_id)
    async with contextlib.aclosing(stream(engine, prep, visible)) as items:
        async for item in items:
            yield item


async def stream(
    engine: GenerationBackend | None, prep: Prepared, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    """`tokens` for a given engine and SQL check (`visible`: chunk ids -> those the caller
    may still see), so a benchmark can run the same path over passages of its own."""
    if prep.extracted is not None:
        async for item in _extracted(prep, visible):
            yield item
        return
    if prep.stream is None or engine is None:
        text = prep.canned or ""
        yield text
        yield Final(text, [], NO_USAGE, prep.timings_ms, prep.canned_reason or "no_passages")
        return
    pieces: list[str] = []
    repeat_at: int | None = None
    usage = Usage(prep.prompt_tokens, 0, 0)
    reason = "stop"
    first_at: float | None = None
    engine_stages: dict[str, float] = {}
    links = _ImageFilter()
    it = prep.stream.__aiter__()
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
                usage = await _usage_after_cancel(it, usage)
                finished = True
                break
            if ev.text:
                if first_at is None:
                    first_at = time.perf_counter()
                shown = links.feed(ev.text)
                if shown:
                    pieces.append(shown)
                    yield shown
                    if prep.stop_repetition:
                        repeat_at = repeat_start("".join(pieces))
                        if repeat_at is not None:
                            reason = "repetition"
                            engine.cancel(prep.request_id)
                            usage = await _usage_after_cancel(it, usage)
                            finished = True
                            break
            if ev.finished:
                finished = True
                reason = str(ev.finish_reason)
                if ev.usage is not None:
                    usage = ev.usage
                    # The engine's split of the time to first token, when it gives one.
                    split = (("queue", usage.queue_ms), ("prefill", usage.prefill_ms))
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
    streamed = "".join(pieces)
    if reason == "repetition" and repeat_at is None:  # the engine's stop
        repeat_at = repeated_tail(streamed)
    answer, repeated = cut(streamed, repeat_at)
    t = time.perf_counter()
    cited, unsupported, echoed = await asyncio.to_thread(_review, prep, answer, visible)
    timings["cite"] = _ms(t)
    timings["total"] = round(prep.deadline.elapsed_ms(), 3)
    yield Final(answer, cited, usage, timings, reason, unsupported, echoed, repeated=repeated)


def _review(
    prep: Prepared, answer: str, visible: Visible
) -> tuple[list[Citation], list[Span], list[Span]]:
    opts = prep.review
    reviewed = review(
        answer, prep.passages, threshold=opts.threshold, instruction=opts.instruction,
        how=opts.how,
    )  # fmt: skip
    return citations(prep.passages, reviewed, visible), reviewed.unsupported, reviewed.echoed


async def _extracted(prep: Prepared, visible: Visible) -> AsyncGenerator[str | Final, None]:
    """The extractive answer: its text at once, then a Final with its quotes and their
    citations (only those whose chunk the caller may still see)."""
    assert prep.extracted is not None
    t = time.perf_counter()
    allowed = await asyncio.to_thread(visible, sorted({q.chunk_id for q in prep.extracted.quotes}))
    quotes = [q for q in prep.extracted.quotes if q.chunk_id in allowed]
    # A quote may hold brackets of its own (x[0]): its citation comes from the quote, never
    # from parsing the text.
    pieces: list[str] = []
    spans: dict[int, list[Span]] = {}
    at = 0
    for q in quotes:
        piece = f"{q.text} [{q.marker}]"
        spans.setdefault(q.marker, []).append((at, at + len(piece)))
        pieces.append(piece)
        at += len(piece) + 1
    answer = " ".join(pieces)
    if answer:
        yield answer
    reviewed = Review([(n, tuple(s), False) for n, s in spans.items()])
    cited = citations(prep.passages, reviewed, lambda ids: allowed & set(ids))
    timings = dict(prep.timings_ms)
    timings["cite"] = _ms(t)
    timings["total"] = round(prep.deadline.elapsed_ms(), 3)
    yield Final(answer, cited, NO_USAGE, timings, "stop" if quotes else "no_evidence",
                quotes=quotes)  # fmt: skip


async def collect(services: Services, prep: Prepared) -> Final:
    """The whole answer at once. A caller that goes away meanwhile cancels it too."""
    final: Final | None = None
    async with contextlib.aclosing(tokens(services, prep)) as stream:
        async for item in stream:
            if isinstance(item, Final):
                final = item
    assert final is not None  # tokens() always ends with one
    return final


async def _usage_after_cancel(it: AsyncIterator[TokenEvent], usage: Usage) -> Usage:
    """A cancelled request still reports its usage on its last event; wait briefly."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CANCEL_GRACE_S):
            async for ev in it:
                if ev.finished and ev.usage is not None:
                    return ev.usage
    return usage


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


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 3)
