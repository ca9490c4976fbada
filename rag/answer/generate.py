"""From a prepared answer to the final event: one `events()` for each kind of answer.

A `Prepared` answer is one of four: `Refused` (the documents do not answer; no generator),
`Quoted` (the extractive mode: the sentences that answer, with their spans), `Grounded` (the
default with the bundled model: the quote first, then one generated sentence, held until it
is complete and shown only if rag.answer.check passes it) and `Generating` (several passages
in one prompt, streamed as written and reviewed sentence by sentence at the end: a remote
model's default). `start` admits and submits (overload refused before any work: HTTP 429);
`tokens` yields the text pieces, then one `Final`, whose `answer_source` says where the answer
came from (generated / quoted / refused). The deadline stops a generation (finish reason
`deadline`), a client that goes away cancels it and frees its KV blocks, and citations are
checked against SQL before they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rag.answer.check import MAX_SENTENCE_CHARS, first_sentence, passes
from rag.answer.cite import (
    MARKER,
    Citation,
    Review,
    Span,
    Visible,
    citations,
    review,
    visible_in,
)
from rag.answer.extract import Extracted, Quote
from rag.answer.history import Resolved
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
NOT_FOUND = "The documents do not contain an answer to this question."
NO_USAGE = Usage(0, 0, 0)


@dataclass(frozen=True)
class ReviewOptions:
    """How the answer's sentences are checked (AskSettings): rag.answer.cite.review."""

    threshold: float = 0.5
    instruction: tuple[str, ...] = ()  # the system instruction's sentences


@dataclass(kw_only=True)
class Prepared:
    """What exists before the first token: the passages given, and for a generated answer
    the running generation. One of the subclasses below, each with its own `events`."""

    tenant_id: str
    collection_id: str  # "" for plain chat
    passages: list[Passage]  # those given (to the model, or quoted), numbered from 1
    search: SearchResult | None
    deadline: Deadline
    timings_ms: dict[str, float]
    request_id: str
    mode: str = "generate"  # generate | extractive
    # The question as searched and answered (a follow-up made stand-alone), and how.
    resolved: Resolved | None = None

    @property
    def searched_query(self) -> str | None:
        return self.resolved.query if self.resolved is not None else None

    @property
    def stream(self) -> AsyncIterator[TokenEvent] | None:
        """The running generation, if any (a client that goes away cancels it)."""
        return None

    def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        raise NotImplementedError


@dataclass(kw_only=True)
class Refused(Prepared):
    """No answer from these documents (or none indexed): a fixed text, no generator."""

    text: str
    reason: str  # no_passages | no_evidence | not_indexed

    async def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        yield self.text
        yield Final(self.text, [], NO_USAGE, self.timings_ms, self.reason, answer_source="refused")


@dataclass(kw_only=True)
class Quoted(Prepared):
    """The extractive answer: the quotes, at once."""

    extracted: Extracted

    def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        return _extracted(self, visible)


@dataclass(kw_only=True)
class Running(Prepared):
    """A generation submitted to the engine."""

    generation: AsyncIterator[TokenEvent]
    submitted_at: float = 0.0
    prompt_tokens: int = 0

    @property
    def stream(self) -> AsyncIterator[TokenEvent] | None:
        return self.generation


@dataclass(kw_only=True)
class Generating(Running):
    """Passages in one prompt, the answer streamed as written and reviewed at the end."""

    review: ReviewOptions = ReviewOptions()
    stop_repetition: bool = False  # stop a sentence that begins as an earlier one (loops.py)

    def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        assert engine is not None
        return _generated(engine, self, visible)


@dataclass(kw_only=True)
class Grounded(Running):
    """The quote of the one passage given, then a generated sentence over that passage,
    shown only when rag.answer.check passes it."""

    quote: Extracted
    question: str

    def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        assert engine is not None
        return _grounded(engine, self, visible)


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
    # Where the answer came from: "generated" (the generator wrote it, or a checked sentence
    # of it follows the quote), "quoted" (sentences of the documents only) or "refused".
    answer_source: str = "generated"


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


def stream(
    engine: GenerationBackend | None, prep: Prepared, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    """`tokens` for a given engine and SQL check (`visible`: chunk ids -> those the caller
    may still see), so a benchmark can run the same path over passages of its own."""
    return prep.events(engine, visible)


class _Run:
    """One submitted generation drained: its text pieces until it finishes, the deadline
    passes or it fails, then how it ended (`reason`, `usage`, the engine's stages)."""

    def __init__(self, engine: GenerationBackend, prep: Running) -> None:
        self.engine = engine
        self.prep = prep
        self.reason = "stop"
        self.usage = Usage(prep.prompt_tokens, 0, 0)
        self.stages: dict[str, float] = {}
        self.first_at: float | None = None
        self._it = prep.generation.__aiter__()
        self._finished = False

    async def pieces(self) -> AsyncGenerator[str, None]:
        prep = self.prep
        try:
            while True:
                timeout = None
                if prep.deadline.bounded:
                    timeout = max(0.0, prep.deadline.remaining_ms() / 1000.0)
                try:
                    ev = await asyncio.wait_for(self._it.__anext__(), timeout)
                except StopAsyncIteration:
                    self._finished = True
                    return
                except TimeoutError:
                    await self.stop("deadline")
                    return
                if ev.text:
                    if self.first_at is None:
                        self.first_at = time.perf_counter()
                    yield ev.text
                if ev.finished:
                    self._finished = True
                    self.reason = str(ev.finish_reason)
                    if ev.usage is not None:
                        self.usage = ev.usage
                        # The engine's split of the time to first token, when it gives one.
                        split = (("queue", ev.usage.queue_ms), ("prefill", ev.usage.prefill_ms))
                        self.stages = {stage: ms for stage, ms in split if ms is not None}
                    return
        except EngineError as exc:
            log.warning("generation %s failed: %s", prep.request_id, type(exc).__name__)
            self.reason = "error"
            self._finished = True
        finally:
            if not self._finished:  # the caller went away: free the KV blocks now
                self.engine.cancel(prep.request_id)
                aclose = getattr(self._it, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()

    async def stop(self, reason: str) -> None:
        """End the generation early (`reason` becomes the finish reason), keeping its usage."""
        self.reason = reason
        self.engine.cancel(self.prep.request_id)
        self.usage = await _usage_after_cancel(self._it, self.usage)
        self._finished = True

    def timings(self) -> dict[str, float]:
        prep = self.prep
        timings = dict(prep.timings_ms)
        timings.update(self.stages)
        if self.first_at is not None:
            timings["first_token"] = round((self.first_at - prep.submitted_at) * 1000.0, 3)
        timings["generate"] = round((time.perf_counter() - prep.submitted_at) * 1000.0, 3)
        return timings


async def _generated(
    engine: GenerationBackend, prep: Generating, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    pieces: list[str] = []
    repeat_at: int | None = None
    links = _ImageFilter()
    run = _Run(engine, prep)
    async with contextlib.aclosing(run.pieces()) as texts:
        async for text in texts:
            shown = links.feed(text)
            if not shown:
                continue
            pieces.append(shown)
            yield shown
            if prep.stop_repetition:
                repeat_at = repeat_start("".join(pieces))
                if repeat_at is not None:
                    await run.stop("repetition")
                    break
    tail = links.flush()
    if tail:
        pieces.append(tail)
        yield tail
    timings = run.timings()
    streamed = "".join(pieces)
    if run.reason == "repetition" and repeat_at is None:  # the engine's stop
        repeat_at = repeated_tail(streamed)
    answer, repeated = cut(streamed, repeat_at)
    t = time.perf_counter()
    cited, unsupported, echoed = await asyncio.to_thread(_review, prep, answer, visible)
    timings["cite"] = _ms(t)
    timings["total"] = round(prep.deadline.elapsed_ms(), 3)
    yield Final(answer, cited, run.usage, timings, run.reason, unsupported, echoed,
                repeated=repeated)  # fmt: skip


async def _grounded(
    engine: GenerationBackend, prep: Grounded, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    """The quote at once, then the generated sentence once it is complete and checked."""
    quote = prep.quote.quotes[0]
    allowed = await asyncio.to_thread(visible, [quote.chunk_id])
    run = _Run(engine, prep)
    if quote.chunk_id not in allowed:  # deleted since it was retrieved
        await run.stop("cancelled")
        yield NOT_FOUND
        yield Final(NOT_FOUND, [], run.usage, run.timings(), "no_evidence",
                    answer_source="refused")  # fmt: skip
        return
    shown = f"{quote.text} [1]"
    prep.timings_ms["first_token"] = round((time.perf_counter() - prep.submitted_at) * 1000, 3)
    yield shown
    written = ""
    end: int | None = None
    async with contextlib.aclosing(run.pieces()) as texts:
        async for text in texts:
            written += text
            end = first_sentence(written)
            if end is not None or len(written) > MAX_SENTENCE_CHARS:
                await run.stop("stop")
                break
    if end is None and run.reason == "stop":  # the generator finished: the text is whole
        end = first_sentence(written, finished=True)
    # A sentence cut short (max_tokens, the deadline, an error) is never shown.
    sentence = written[:end].strip() if end is not None else ""
    checked = (
        bool(sentence)
        and run.reason in ("stop", "length")
        and passes(
            sentence, question=prep.question, passage=prep.passages[0].text, quote=quote.text
        )
    )
    timings = run.timings()
    timings["first_token"] = prep.timings_ms["first_token"]
    spans: tuple[Span, ...] = ((0, len(shown)),)
    if checked:
        if not MARKER.search(sentence):
            sentence = f"{sentence} [1]"
        yield " " + sentence
        timings["generated"] = round((time.perf_counter() - prep.submitted_at) * 1000, 3)
        spans = (*spans, (len(shown) + 1, len(shown) + 1 + len(sentence)))
        shown = f"{shown} {sentence}"
    t = time.perf_counter()
    reviewed = Review([(1, spans, False)])
    cited = citations(prep.passages, reviewed, lambda ids: allowed & set(ids))
    timings["cite"] = _ms(t)
    timings["total"] = round(prep.deadline.elapsed_ms(), 3)
    reason = run.reason if run.reason in ("deadline", "error") else "stop"
    yield Final(shown, cited, run.usage, timings, reason, quotes=list(prep.quote.quotes),
                answer_source="generated" if checked else "quoted")  # fmt: skip


def _review(
    prep: Generating, answer: str, visible: Visible
) -> tuple[list[Citation], list[Span], list[Span]]:
    opts = prep.review
    reviewed = review(answer, prep.passages, threshold=opts.threshold, instruction=opts.instruction)
    return citations(prep.passages, reviewed, visible), reviewed.unsupported, reviewed.echoed


async def _extracted(prep: Quoted, visible: Visible) -> AsyncGenerator[str | Final, None]:
    """The extractive answer: its text at once, then a Final with its quotes and their
    citations (only those whose chunk the caller may still see)."""
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
                quotes=quotes, answer_source="quoted" if quotes else "refused")  # fmt: skip


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
