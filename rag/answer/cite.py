"""Citations: each sentence of the answer tied to the passage it is drawn from, re-checked in SQL.

A sentence that writes ``[n]`` cites passage n (the engine's citation mask lets a marker name
only the passages given). A sentence without a marker is attributed to the given passage that
holds most of its content words, when that passage holds at least `threshold` of them; a
sentence no passage supports stays uncited and is reported as unsupported, never shown as a
cited fact. A sentence that repeats the system instruction is reported as echoed. Markers
that point nowhere, or to a chunk deleted since or never the caller's, are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rag.db import Database, chunks
from rag.retrieve import Passage

# "[2]", "[1, 3]"; not an index such as x[0] or f(a)[1] (the engine's citation mask tells
# them apart the same way).
MARKER = re.compile(r"(?<![\w)])\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]")
# A sentence with fewer content terms than this ("Yes.", a heading) claims nothing to check.
SENTENCE_MIN_TERMS = 3

Span = tuple[int, int]  # [start, end) in the answer's characters
Visible = Callable[[Sequence[int]], set[int]]  # chunk ids -> those the caller may still see


class HasText(Protocol):
    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class Citation:
    marker: int
    chunk_id: int
    document_id: str
    filename: str
    start_char: int
    end_char: int
    # False: the answer wrote [n]. True: it wrote no marker there, and the server attributed
    # the sentences to the given passage that holds most of their words.
    attributed: bool = False
    # The answer's sentences that cite it, as [start, end) character spans of the answer.
    sentences: tuple[Span, ...] = ()


@dataclass(frozen=True)
class Review:
    """What the server makes of an answer's sentences, before the SQL check."""

    cited: list[tuple[int, tuple[Span, ...], bool]]  # (passage number, sentences, attributed)
    unsupported: list[Span] = field(default_factory=list)
    echoed: list[Span] = field(default_factory=list)


# ---------------------------------------------------------------- words and sentences

# Function words, question words and the words answers use about their sources: none says
# what a sentence is about.
STOP = frozenset(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few
    for from further had has have having he her here hers herself him himself his how i if
    in into is it its itself just let me more most my myself no nor not now of off on once
    only or other our ours out over own same she should so some such than that the their
    theirs them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours yourself
    may might must shall cannot wouldn isn aren doesn didn don won hasn haven wasn weren
    one ones thing things kind sort way ways used use using make makes made get gets got
    passage passages document documents text answer answers question questions provided
    mentioned according information context cite cited say says said given describe
    describes explain explains tell called named known many much well like none always
    never seem seems""".split()
)
_TERM = re.compile(r"[^\W_]+(?:[.'][^\W_]+)*", re.UNICODE)
_SUFFIXES = ("ations", "ation", "ingly", "ings", "ing", "ies", "ied", "edly", "ed", "es", "ly", "s")


def stem(word: str) -> str:
    """A crude stem: lower case, a common suffix off, at most 6 letters (so "grouping",
    "groups" and "group" meet, and "calculation" meets "calculate")."""
    w = word.lower().replace("'", "")
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            break
    if len(w) > 3 and w.endswith("e"):  # "leave" meets "leaves", "house" "houses"
        w = w[:-1]
    return w[:6]


def stopped(word: str) -> bool:
    """Whether a lower-cased word says nothing of what a text is about: a function word, or a
    contraction of one ("i've", "we're", "don't")."""
    return word in STOP or ("'" in word and word.split("'", 1)[0] in STOP)


def terms(text: str) -> set[str]:
    """The content terms of `text`, stemmed: words of three letters or more, numbers and
    short codes with a digit ("P1", "4G"), without function words; a short range of codes
    or numbers stands for each in it ("G1–G6" holds "G4", "G7+" "G8", "3 to 5 years" "4")."""
    out = set()
    for m in _TERM.finditer(MARKER.sub(" ", text)):
        w = m.group(0).lower().removesuffix("'s")
        if stopped(w) or (len(w) < 3 and not any(c.isdigit() for c in w)):
            continue
        out.add(stem(w))
    if any(c.isdigit() for c in text):
        out |= _code_ranges(text)
    out |= _day_ranges(text)
    return out


# A range of codes or numbers: "G1–G6", "P2 to P4", "G7+", "G7 and above", "3 to 5 years",
# "5 years or more", "more than 10 years". Bounded repeats only.
_CODE_RANGE = re.compile(
    r"(?<![^\s(])(?P<more>(?i:more|over|greater)\s(?:than\s)?)?"
    r"(?P<prefix>[A-Za-z]{1,3})?(?P<low>\d{1,4})(?P<unit>\s(?!and\s|or\s|to\s)[a-z]{3,8})?"
    r"(?:\s{0,3}(?:[\u2013\u2014-]|to|to\sless\sthan)\s{0,3}(?P<prefix2>[A-Za-z]{1,3})?(?P<high>\d{1,4})"
    r"|(?P<plus>\+|\s(?:and|or)\s(?:above|higher|over|more)))?(?!\w|[:.,]\d)"
)
RANGE_MAX = 30  # codes or numbers a range may stand for ("G7+": G7 to G36)


def _code_ranges(text: str) -> set[str]:
    out: set[str] = set()
    for m in _CODE_RANGE.finditer(text):
        prefix, low = (m["prefix"] or "").lower(), int(m["low"])
        if m["more"] and not m["high"] and not m["plus"]:
            low, high = low + 1, low + RANGE_MAX
        elif m["plus"]:
            high = low + RANGE_MAX - 1
        elif m["high"] is not None and (m["prefix2"] or "").lower() in ("", prefix):
            high = int(m["high"])
        else:
            continue
        if low < high < low + RANGE_MAX:
            out.update(f"{prefix}{n}" for n in range(low, high + 1))
    return out


_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY = r"(?:mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?|sun)(?:day)?"
# "Monday to Friday", "Mon–Fri", "weekdays", "at weekends": the days each stands for.
_DAY_RANGE = re.compile(
    rf"\b(?i:(?P<low>{_DAY})\s{{0,3}}(?:[\u2013\u2014-]|to|until|through|thru)\s{{0,3}}"
    rf"(?P<high>{_DAY})|(?P<week>week(?:day|end)s?))\b"
)


def _day_ranges(text: str) -> set[str]:
    out: set[str] = set()
    days: tuple[str, ...]
    for m in _DAY_RANGE.finditer(text):
        if m["week"]:
            days = _DAYS[:5] if "day" in m["week"].lower() else _DAYS[5:]
        else:
            low, high = (_day_index(m[g]) for g in ("low", "high"))
            days = tuple(_DAYS[(low + n) % 7] for n in range((high - low) % 7 + 1))
        out.update(stem(d) for d in days)
    return out


def _day_index(word: str) -> int:
    w = word.lower()
    return next(n for n, d in enumerate(_DAYS) if w[:3] == d[:3])


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*")


def sentences(text: str) -> list[Span]:
    """[start, end) spans of the sentences of `text` (split after . ! ? and at line breaks),
    without their surrounding space. Markers written after a sentence's full stop
    ("... noon. [2]") belong to that sentence."""
    spans: list[Span] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(text)))
    out: list[Span] = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        lead = re.match(r"(?:\[\d{1,4}(?:\s*,\s*\d{1,4})*\]\s*)+", text[s:e])
        if lead and out:  # "[2] Next sentence": the markers close the sentence before
            out[-1] = (out[-1][0], s + len(lead.group(0).rstrip()))
            s += lead.end()
        if s < e:
            out.append((s, e))
    return out


# ---------------------------------------------------------------- reviewing an answer


def markers(answer: str) -> list[int]:
    """The passage numbers the answer cites, in order of first appearance."""
    seen: list[int] = []
    for m in MARKER.finditer(answer):
        for part in m.group(1).split(","):
            n = int(part)
            if n not in seen:
                seen.append(n)
    return seen


def support(sentence_terms: set[str], passage_terms: set[str]) -> float:
    """The share of a sentence's content terms the passage holds."""
    if not sentence_terms:
        return 0.0
    return len(sentence_terms & passage_terms) / len(sentence_terms)


def chooser(given: Sequence[HasText]) -> Callable[[str], tuple[int, ...]]:
    """For the citation mask (SamplingParams.cite_choice): a sentence's text -> the given
    passages (numbered from 1) that best support it, all those tied at the highest share of
    its content terms; () when none holds any of them."""
    held = [terms(p.text) for p in given]

    def choose(sentence: str) -> tuple[int, ...]:
        said = terms(sentence)
        scores = [support(said, t) for t in held]
        best = max(scores, default=0.0)
        if best <= 0.0:
            return ()
        return tuple(n for n, score in enumerate(scores, start=1) if score == best)

    return choose


def review(
    answer: str,
    given: Sequence[HasText],
    *,
    threshold: float = 0.5,
    instruction: Sequence[str] = (),
) -> Review:
    """Which given passage (numbered from 1) each sentence of `answer` cites or is drawn
    from; the sentences no passage supports; those that repeat `instruction` (the sentences
    of the system instruction)."""
    passage_terms = [terms(p.text) for p in given]
    told = [terms(s) for s in instruction]
    order: list[int] = []
    spans: dict[int, list[Span]] = {}
    written: set[int] = set()
    unsupported: list[Span] = []
    echoed: list[Span] = []
    for s, e in sentences(answer):
        text = answer[s:e]
        own = terms(text)
        if len(own) >= SENTENCE_MIN_TERMS and any(support(own, t) >= 0.8 for t in told if t):
            echoed.append((s, e))
            continue
        numbers = [n for n in markers(text) if 1 <= n <= len(given)]
        if numbers:
            written.update(numbers)
        elif len(own) >= SENTENCE_MIN_TERMS:
            shares = [support(own, t) for t in passage_terms]
            best = max(range(len(shares)), key=lambda i: (shares[i], -i), default=None)
            if best is None or shares[best] < threshold:
                unsupported.append((s, e))
                continue
            numbers = [best + 1]
        for n in numbers:
            if n not in spans:
                order.append(n)
                spans[n] = []
            spans[n].append((s, e))
    cited = [(n, tuple(spans[n]), n not in written) for n in order]
    return Review(cited, unsupported, echoed)


# ---------------------------------------------------------------- checked against SQL


def citations(given: Sequence[Passage], reviewed: Review, visible: Visible) -> list[Citation]:
    """The reviewed citations whose chunk the caller may still see (`visible` asks SQL)."""
    if not reviewed.cited:
        return []
    allowed = visible(sorted({given[n - 1].chunk_id for n, _, _ in reviewed.cited}))
    out = []
    for n, spans, attributed in reviewed.cited:
        p = given[n - 1]
        if p.chunk_id in allowed:
            out.append(Citation(n, p.chunk_id, p.document_id, p.filename, p.start_char,
                                p.end_char, attributed, spans))  # fmt: skip
    return out


def visible_in(db: Database, tenant_id: str, collection_id: str) -> Visible:
    def visible(ids: Sequence[int]) -> set[int]:
        with db.read() as session:
            return chunks.visible_ids(session, tenant_id, collection_id, ids)

    return visible


def cite(
    db: Database,
    tenant_id: str,
    collection_id: str,
    given: Sequence[Passage],
    answer: str,
    **how: object,
) -> list[Citation]:
    """The answer's citations among the passages `given` (numbered from 1) that the tenant
    may still see (`how`: review's options)."""
    reviewed = review(answer, given, **how)  # type: ignore[arg-type]
    return citations(given, reviewed, visible_in(db, tenant_id, collection_id))
