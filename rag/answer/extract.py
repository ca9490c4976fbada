"""Evidence and extraction: what the passages hold of a question, without the generator.

`evidence` is the cheap check before generation: the question's content terms, and its names
(capitalised words, numbers), looked up in the passages given. A question whose names no
passage holds, or whose terms they mostly lack, is refused without running the generator:
a collection always has some vaguely similar passage, so the retrieval score alone cannot
say that the documents are silent.

`extract` is the extractive mode: the passage sentences that best answer the question,
quoted with their spans in the document (like citations) and their passage numbers. Instant
and always grounded; a question no sentence supports gets no quote.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rag.answer.cite import STOP, sentences, stem, terms


class PassageLike(Protocol):
    @property
    def chunk_id(self) -> int: ...
    @property
    def document_id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def start_char(self) -> int: ...


# ---------------------------------------------------------------- evidence

_NAME = re.compile(r"[^\W_]+(?:[.'-][^\W_]+)*", re.UNICODE)


@dataclass(frozen=True)
class Evidence:
    terms: frozenset[str]  # the question's content terms (stemmed)
    found: frozenset[str]  # those some passage holds
    names: frozenset[str]  # the question's names: capitalised words past its first, numbers
    names_found: frozenset[str]

    @property
    def coverage(self) -> float:
        return len(self.found) / len(self.terms) if self.terms else 1.0

    def answerable(self, min_coverage: float) -> bool:
        """Every name found, and at least `min_coverage` of the terms."""
        return self.names == self.names_found and self.coverage >= min_coverage


def names(question: str) -> set[str]:
    """Capitalised words that do not start a sentence, and numbers: what a question is about
    and no other passage can stand in for ("the capital of Vrelnia", "model X200")."""
    out = set()
    first = True
    for m in _NAME.finditer(question):
        w = m.group(0)
        lower = w.lower()
        named = any(ch.isdigit() for ch in w) or (not first and w[:1].isupper())
        if named and lower not in STOP:
            out.add(stem(lower))
        first = question[m.end() : m.end() + 2].lstrip(" \"'")[:1] in (".", "?", "!", ":")
    return out


def evidence(question: str, passages: Sequence[PassageLike]) -> Evidence:
    wanted = terms(question)
    named = names(question) & wanted if wanted else names(question)
    held: set[str] = set()
    for p in passages:
        held |= terms(p.text)
        if hasattr(p, "filename"):
            held |= terms(str(p.filename))
    return Evidence(frozenset(wanted), frozenset(wanted & held), frozenset(named),
                    frozenset(named & held))  # fmt: skip


# ---------------------------------------------------------------- extraction


@dataclass(frozen=True)
class Quote:
    marker: int  # the passage's number among those given, [1] first
    chunk_id: int
    document_id: str
    text: str  # the sentence, as in the document
    start_char: int  # its span in the document's extracted text
    end_char: int
    score: float


@dataclass(frozen=True)
class Extracted:
    answer: str  # the quotes, each followed by its [n]
    quotes: list[Quote]
    support: float  # the best sentence's share of the question's weighted terms


def extract(
    question: str,
    passages: Sequence[PassageLike],
    *,
    max_sentences: int = 3,
    max_words: int = 90,
    min_support: float = 0.3,
) -> Extracted:
    """The sentences that best answer `question`: the best one, then the sentences around
    it in its passage (what explains it), at most `max_sentences` and about `max_words` words,
    in reading order. One passage only: sentences that answer nearly as well from other
    passages were measured to cite the wrong passage far more often than they add an answer
    (bench/answers.py). A sentence is scored by the share of the question's terms it holds,
    each weighted by how rare it is among the passages (a term every passage holds tells
    nothing), with a small bonus for the stronger passages and for a passage's opening
    sentence (where summaries define their subject)."""
    wanted = terms(question)
    pieces: list[tuple[int, int, int, set[str]]] = []  # passage index, start, end, terms
    held: list[set[str]] = []
    for i, p in enumerate(passages):
        held.append(terms(p.text))
        for s, e in sentences(p.text):
            pieces.append((i, s, e, terms(p.text[s:e])))
    if not wanted or not pieces:
        return Extracted("", [], 0.0)
    n = len(passages)
    weight = {t: math.log(1.0 + (n + 1) / (1 + sum(t in h for h in held))) for t in wanted}
    total = sum(weight.values())
    shares: list[float] = []
    scores: list[float] = []
    for order, (i, _, _, own) in enumerate(pieces):
        share = sum(weight[t] for t in wanted & own) / total
        opening = 0.05 if order == 0 or pieces[order - 1][0] != i else 0.0
        shares.append(share)
        scores.append(share + opening + 0.03 / (1 + i))
    top = max(range(len(pieces)), key=lambda j: (scores[j], -j))
    best = shares[top]
    if best < min_support:
        return Extracted("", [], round(best, 4))
    # The best sentence, then its neighbours in its passage, the next one first.
    home = pieces[top][0]
    around = sorted(
        (j for j in range(len(pieces)) if pieces[j][0] == home and j != top),
        key=lambda j: abs(j - top) + (0.5 if j < top else 0.0),
    )
    chosen = [top]
    words = _words(passages, pieces[top])
    for j in around:
        if len(chosen) >= max_sentences:
            break
        size = _words(passages, pieces[j])
        if words + size > max_words:
            continue
        chosen.append(j)
        words += size
    quotes = []
    for j in sorted(chosen):
        i, s, e, _ = pieces[j]
        p = passages[i]
        quotes.append(Quote(i + 1, p.chunk_id, p.document_id, p.text[s:e], p.start_char + s,
                            p.start_char + e, round(shares[j], 4)))  # fmt: skip
    answer = " ".join(f"{q.text} [{q.marker}]" for q in quotes)
    return Extracted(answer, quotes, round(best, 4))


def _words(passages: Sequence[PassageLike], piece: tuple[int, int, int, set[str]]) -> int:
    i, s, e, _ = piece
    return len(passages[i].text[s:e].split())
