"""The four kinds of prepared answer, and how each becomes its events: the text pieces, then
one `Final`.

`Refused` (the documents do not answer; no generator), `Quoted` (the extractive mode: the
sentences that answer, with their spans), `Grounded` (the default with the bundled model: the
quote first, then one generated sentence, held until it is complete and shown only if
rag.answer.check passes it) and `Generating` (several passages in one prompt, streamed as
written and reviewed sentence by sentence at the end: a remote model's default). Citations are
checked against SQL (`visible`) before they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from rag.answer.check import MAX_SENTENCE_CHARS, first_sentence, passes
from rag.answer.cite import (
    MARKER,
    Citation,
    Review,
    Span,
    Visible,
    citations,
    review,
)
from rag.answer.extract import Extracted
from rag.answer.loops import cut, repeat_start, repeated_tail
from rag.answer.prepared import NO_USAGE, NOT_FOUND, Final, Prepared, Running
from rag.answer.run import Run
from rag.engine.protocol import GenerationBackend


@dataclass(frozen=True)
class ReviewOptions:
    """How the answer's sentences are checked (AskSettings): rag.answer.cite.review."""

    threshold: float = 0.5
    instruction: tuple[str, ...] = ()  # the system instruction's sentences


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


async def _generated(
    engine: GenerationBackend, prep: Generating, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    pieces: list[str] = []
    repeat_at: int | None = None
    links = _ImageFilter()
    run = Run(engine, prep)
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
    run = Run(engine, prep)
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
