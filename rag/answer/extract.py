"""The quote: the sentence that answers a question, as in the document, with its span.

The sentence is the one rag.answer.evidence chose (by the question's terms, what it asks
for, and the passage's dense score); the extractive mode may add the best of its passage's
other sentences after it, in reading order, up to a number of sentences and words. Instant
and always grounded; a question no sentence answers gets no quote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag.answer.evidence import Choice, PassageLike
from rag.answer.prompt import neutralise

# ---------------------------------------------------------------- extraction


@dataclass(frozen=True)
class Quote:
    marker: int  # the passage's number among those given, [1] first
    chunk_id: int
    document_id: str
    # The sentence, as in the document (links, images and chat markers neutralised); the
    # clause of it that answers, when it states several facts of the kind asked for; a
    # table's cell as "row, column: cell".
    text: str
    start_char: int  # its span (the sentence's, the clause's, the cell's) in the document
    end_char: int
    score: float


@dataclass(frozen=True)
class Extracted:
    answer: str  # the quotes, each followed by its [n]
    quotes: list[Quote]
    support: float  # the best sentence's share of the question's weighted terms


def extract(
    passages: Sequence[PassageLike],
    choice: Choice,
    *,
    max_sentences: int = 1,
    max_words: int = 90,
) -> Extracted:
    """The chosen sentence first, then (up to `max_sentences` and about `max_words` words)
    the best of its passage's other sentences, in reading order. One passage only: sentences
    that answer nearly as well from other passages cite the wrong passage far more often
    than they add an answer."""
    p = passages[choice.passage]
    chosen = [choice.span]
    words = _words(p.text, choice.span)
    for span in choice.others:
        if len(chosen) >= max_sentences:
            break
        size = _words(p.text, span)
        if words + size > max_words:
            continue
        chosen.append(span)
        words += size
    marker = choice.passage + 1
    s, e = choice.focus or choice.span
    text = neutralise(choice.focus_text or p.text[s:e])
    quotes = [Quote(marker, p.chunk_id, p.document_id, text, p.start_char + s,
                    p.start_char + e, choice.share)]  # fmt: skip
    for s, e in sorted(chosen[1:]):
        quotes.append(Quote(marker, p.chunk_id, p.document_id, neutralise(p.text[s:e]),
                            p.start_char + s,
                            p.start_char + e, 0.0))  # fmt: skip
    answer = " ".join(f"{q.text} [{q.marker}]" for q in quotes)
    return Extracted(answer, quotes, choice.share)


def _words(text: str, span: tuple[int, int]) -> int:
    return len(text[span[0] : span[1]].split())
