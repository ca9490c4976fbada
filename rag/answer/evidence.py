"""Evidence first: the passage and the part of it that answers a question, or none.

The bundled 135M generator, shown five passages, answers from the wrong one; retrieval
usually ranks the right one first. So the answer path chooses its evidence before any
generation, by one score over every sentence and table row of the passages retrieved
(rag.answer.units):

- the question's content terms the unit holds, each weighted by how rare it is among the
  passages (a term every passage holds tells nothing); a term its context holds (the heading
  above it, the document's title, the subject a summary names in its first sentence) counts
  for most of one, so "It is held in the Uffizi" answers a question about the painting;
- whether it holds what the question asks for (`Ask`) that the question does not already
  hold: a number for "how many", a year or date for "when", a name after "by" for "who", a
  name after "in" for "where";
- the passage's dense score (retrieval's own judgement, as a prior);
- for the best few, the embedding model's cosine between the question and the unit, and
  again with the subject taken out of both (the question's names, the document's title):
  a document's opening sentence is close to any question about its subject, the sentence
  about what is asked is closer once the subject is gone.

Where the unit states several facts of the kind asked for (a table row; "Starter accounts can
name 2 support contacts, Business accounts 6 and Enterprise accounts 20"), the answer is the
part about what the question names: the cell under the column it names (when its words name
none, the column whose header the embedding model finds closest to it), or the clause that
holds its names. A question is answerable when the unit and its context hold the question's
names (capitalised words, numbers: what no other passage can stand in for), what it asks for,
and enough of its terms. The same choice serves the extractive mode, the grounded answer (the
one passage the generator sees) and the check of what it writes (rag.answer.check). What a
question asks for, and where a text holds it, is read by rag.answer.question.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rag.answer.cite import STOP, stem, terms
from rag.answer.question import (
    RELATIVE,
    WORD,
    Ask,
    Shape,
    ask_of,
    asks_called,
    asks_clock,
    asks_often,
    candidates,
    clock,
    counted,
    currency_asked,
    fits,
    frequencies,
    names_something,
    question_names,
    shape_of,
)
from rag.answer.units import Head, Unit, units


class PassageLike(Protocol):
    @property
    def chunk_id(self) -> int: ...
    @property
    def document_id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def start_char(self) -> int: ...


@dataclass(frozen=True)
class Weights:
    """How a unit is scored; chosen on half a of the factual sets (bench/answers.py)."""

    context: float = 1.0  # a question term its context holds, against one the unit holds
    dense: float = 0.5  # the passage's dense score
    kind: float = 0.5  # the unit holds what the question asks for
    names: float = 0.1  # the unit itself holds the question's names
    # The cosine between the question and the unit (with its title and heading), in the
    # embedding model's space: paraphrases the terms miss ("Which magazine ran it in parts?"
    # and "serialised in The Russian Messenger"). Only the best `shortlist` units by the
    # other parts are embedded.
    similar: float = 2.0
    predicate: float = 0.3  # the share of the question's own words (past names, context)
    # The cosine again with the subject taken out of both: the question's names and the
    # titles' words.
    gist: float = 2.0
    # The unit says what something is called ("is known as public administration") and the
    # question asks for a name by that verb ("What is the implementation ... called?").
    naming: float = 0.5
    shortlist: int = 7  # with the question, one batch of the query encoder


# The kinds of answer a unit must be seen to hold before it answers: numbers, dates and times
# are read reliably; a name, a person or a place often stands in lower case or without the
# word that announces it ("known as hedonism", "repealed by Solon", "except Antarctica"), so
# for those a unit close enough to the question in meaning may answer without it.
STRICT = frozenset({Ask.NUMBER, Ask.TIME})
UNSEEN_KIND = 0.5  # the cosine such a unit needs (chosen on the factual sets' half a)

# What narrows the kind asked: a time of day ("At what times ..."), a frequency ("How often
# ..."), or nothing.
How = Literal["", "clock", "often"]


@dataclass(frozen=True)
class Choice:
    """The evidence for a question among the passages given (index into them)."""

    passage: int
    span: tuple[int, int]  # the quoted unit's [start, end) in the passage's text
    score: float
    share: float  # weighted share of the question's terms in the unit and its context
    own_share: float  # ... in the unit alone
    names_found: bool  # the unit and its context hold every one of the question's names
    kind_found: bool  # the unit holds what the question asks for
    ask: Ask
    # The share of the question's own words (not its names, not what the unit's context
    # says) the unit holds: what the question asks about that the subject does not explain.
    predicate: float = 1.0
    # The unit's cosine with the question, when computed: the whole, or with the subject taken
    # out of both (Weights.gist), whichever is higher.
    similarity: float | None = None
    # The part of the unit that answers ([start, end) in the passage's text) and how to say
    # it, when the unit holds several facts of the kind asked for; else None.
    focus: tuple[int, int] | None = None
    focus_text: str = ""
    # The rest of the passage's units, best first (the extractive mode may quote them).
    others: tuple[tuple[int, int], ...] = ()

    def answerable(
        self,
        min_support: float,
        min_similarity: float = 0.0,
        min_predicate: float = 0.0,
        unseen_kind: float = UNSEEN_KIND,
    ) -> bool:
        """Whether the unit answers: it holds the question's names, enough of its terms, a
        cosine over the floor, and what the question asks for; a name, person or place not
        seen as one may stand when the cosine reaches `unseen_kind` (see STRICT)."""
        seen = self.kind_found or (
            self.ask not in STRICT and self.similarity is not None
            and self.similarity >= unseen_kind
        )  # fmt: skip
        return (
            self.names_found
            and seen
            and self.share >= min_support
            and (self.similarity is None or self.similarity >= min_similarity)
            and self.predicate >= min_predicate
        )


@dataclass
class _Scored:
    passage: int
    unit: Unit
    score: float
    share: float
    own_share: float
    names: bool
    kind: bool
    predicate: float
    focus: tuple[int, int] | None
    similarity: float | None
    focus_text: str


def choose(
    question: str,
    passages: Sequence[PassageLike],
    weights: Weights = Weights(),
    *,
    dense: Sequence[float] | None = None,
    titles: Sequence[str] | None = None,
    similar: Callable[[str, list[str]], Sequence[float]] | None = None,
    heads: Sequence[Head | None] | None = None,
) -> Choice | None:
    """The best sentence or table row of `passages` for `question` (None when they have
    none). `dense`: the passages' dense scores (cosines), strongest first as retrieved;
    `titles`: what names each passage's document (its file name); `similar`: (query, texts)
    -> the texts' cosines with the query (the embedding model), for the shortlist; `heads`:
    the header of the table each passage starts inside, if any (rag.answer.units)."""
    wanted = terms(question)
    names = question_names(question) & wanted if wanted else question_names(question)
    kin = _kin(question, names)
    ask = ask_of(question)
    unit_of = counted(question) if ask is Ask.NUMBER else frozenset()
    how: How = "clock" if ask is Ask.TIME and asks_clock(question) else ""
    how = "often" if ask is Ask.NUMBER and asks_often(question) else how
    shape = shape_of(question, ask)
    currency = currency_asked(question) if shape == "money" else ""
    naming = ask in (Ask.OTHER, Ask.NAME) and asks_called(question)
    named = [terms(_title(titles, i)) for i in range(len(passages))]
    held = [terms(p.text) | named[i] for i, p in enumerate(passages)]
    n = len(passages)
    weight = {t: math.log(1.0 + (n + 1) / (1 + sum(t in h for h in held))) for t in wanted}
    total = sum(weight.values()) or 1.0
    best: _Scored | None = None
    every: list[_Scored] = []
    for i, p in enumerate(passages):
        prior = dense[i] if dense is not None and i < len(dense) else 0.0
        head = heads[i] if heads is not None and i < len(heads) else None
        for u in units(p.text, starts_document=p.start_char == 0, head=head):
            s = _score(i, p.text, u, wanted, names, ask, weight, total, named[i], weights, prior,
                       unit_of, how, kin, shape, naming, currency)  # fmt: skip
            every.append(s)
            if best is None or (s.names, s.score) > (best.names, best.score):
                best = s
    if best is None:
        return None
    if similar is not None and weights.similar:
        shortlist = sorted(every, key=lambda s: (not s.names, -s.score))[: weights.shortlist]
        texts = [_described(passages[s.passage].text, s.unit, _title(titles, s.passage))
                 for s in shortlist]  # fmt: skip
        for s, cosine in zip(shortlist, similar(question, texts), strict=True):
            s.similarity = float(cosine)
            s.score += weights.similar * s.similarity
        if weights.gist:
            # The same with the subject taken out of both: what the question asks about it
            # against what the unit says about it ("Whose novel is the film based on?" and
            # "It is based on Mario Puzo's novel", not "The Godfather is a 1972 film").
            # The words of the shortlist's titles leave the question too: a subject in lower
            # case is no name ("What is the core of a syllable called?" asked of Syllable).
            titled = set().union(*(named[s.passage] for s in shortlist))
            asked = _without(question, names | titled)
            said = [_without(_body(passages[s.passage].text, s.unit), names | named[s.passage])
                    for s in shortlist]  # fmt: skip
            for s, cosine in zip(shortlist, similar(asked, said), strict=True):
                s.score += weights.gist * float(cosine)
                # The floor takes the closer of the two: a question worded far from the
                # document ("chip in for my broadband") may still ask what the unit says.
                s.similarity = max(s.similarity or 0.0, float(cosine))
        best = max(shortlist, key=lambda s: (s.names, s.score))
        if best.unit.cells:
            _by_meaning(question, wanted, passages[best.passage].text, best, ask, similar, how)
    others = sorted((s for s in every if s.passage == best.passage and s is not best),
                    key=lambda s: -s.score)  # fmt: skip
    return Choice(
        passage=best.passage, span=best.unit.span, score=round(best.score, 4),
        share=round(best.share, 4), own_share=round(best.own_share, 4),
        names_found=best.names, kind_found=best.kind, ask=ask, predicate=round(best.predicate, 4),
        similarity=None if best.similarity is None else round(best.similarity, 4),
        focus=best.focus,
        focus_text=best.focus_text, others=tuple(s.unit.span for s in others),
    )  # fmt: skip


def _described(text: str, u: Unit, title: str) -> str:
    """A unit as the embedding model sees it: its title and heading, then its text."""
    head = ". ".join(part for part in (title, u.heading, u.lead.rstrip(":")) if part)
    body = _body(text, u)
    return f"{head}. {body}" if head else body


def _body(text: str, u: Unit) -> str:
    """A unit's text; a table row's cells each after its column's name."""
    if u.header:
        return "; ".join(f"{h}: {text[a:b]}" for h, (a, b) in zip(u.header, u.cells, strict=False))
    return text[u.span[0] : u.span[1]]


def _without(text: str, dropped: set[str]) -> str:
    """`text` without the words whose term is in `dropped` (all of it if that leaves none)."""
    kept = [m.group(0) for m in WORD.finditer(text) if stem(m.group(0).lower()) not in dropped]
    return " ".join(kept) if kept else text


def _title(titles: Sequence[str] | None, i: int) -> str:
    if titles is None or i >= len(titles):
        return ""
    return titles[i].rsplit(".", 1)[0]


def _score(
    passage: int,
    text: str,
    u: Unit,
    wanted: set[str],
    names: set[str],
    ask: Ask,
    weight: dict[str, float],
    total: float,
    title: set[str],
    weights: Weights,
    prior: float,
    unit_of: frozenset[str] = frozenset(),
    how: How = "",
    kin: dict[str, tuple[str, str]] | None = None,
    shape: Shape = "",
    naming: bool = False,
    currency: str = "",
) -> _Scored:
    body = text[u.span[0] : u.span[1]]
    own = terms(body)
    context = (
        title | terms(u.heading) | terms(u.subject) | terms(u.lead) | terms(" ".join(u.header))
    )
    own_share = sum(weight[t] for t in wanted & own) / total
    share = own_share + weights.context * sum(weight[t] for t in (wanted & context) - own) / total
    names_in_unit = names <= own
    missing = names - own - context
    if missing and kin:
        # "Scottish" is named by "Scotland", "MoMA" by "Museum of Modern Art".
        said = " ".join((body, u.heading, u.subject, u.lead))
        missing = {n for n in missing if n not in kin or not _called(kin[n], said)}
    names_found = not missing
    focus, focus_text = None, ""
    if u.cells:
        columns = _columns(u, wanted)
        if len(columns) > 1 and _named(u, columns):
            # Several columns the question may mean: the first holding what it asks for, until
            # the cosine decides (choose, for the chosen row).
            columns = [n for n in columns if _holds(text, u.cells[n], ask, how)] or columns
        elif how and columns and not any(_holds(text, u.cells[n], ask, how) for n in columns):
            # The column the question's words name ("Maintenance window") does not say how
            # often or at what time; the one column that does answers.
            holding = [n for n in range(1, len(u.cells)) if _holds(text, u.cells[n], ask, how)]
            columns = holding if len(holding) == 1 else columns
        single = len(columns) == 1 or not u.cells[2:]
        cell = u.cells[columns[0]] if columns and (single or _named(u, columns)) else None
        found = ask is Ask.OTHER or (cell is not None and _holds(text, cell, ask, how))
        if cell is not None:
            focus, focus_text = cell, _cell_text(text, u, cell)
    else:
        hits = candidates(body, ask, wanted)
        found = bool(hits) or ask is Ask.OTHER  # no kind asked: any relevant unit may answer
        if how == "clock":
            # "At what times ...": a time of day answers, not a weekday or a date.
            hits = [h for h in hits if clock(body[h[0] : h[1]])]
            found = bool(hits)
        elif how == "often":
            # "How often ...": "every 6 hours" answers, not "90 days" or "at 01:00".
            hits = frequencies(body)
            found = bool(hits)
        if shape and hits:
            # Of several candidates, those of the shape asked pick the clause ("sold for $250",
            # not "donated ... in 1934"). A sum, a count or a measure asked for and none in the
            # unit: it does not answer ("How much did the film cost?" against "a 1942 film"),
            # unless it says the amount against another or as none ("double the A4 price").
            kept = [h for h in hits if fits(body, h, shape)]
            found = found and (bool(kept) or shape == "date" or bool(own & RELATIVE))
            hits = kept if 0 < len(kept) < len(hits) else hits
        elif shape == "money" and own & RELATIVE:
            found = True  # "The shuttle bus is free for staff."
        if unit_of and not unit_of & own:
            found = False  # "how many pages": a number, but none of pages
        # "in US dollars": of "£16 or $21", the amount in dollars picks its clause.
        priced = [h for h in hits if body[max(0, h[0] - 1) : h[0]] == currency] if currency else []
        priced_one = 0 < len(priced) < len(hits)
        hits = priced if priced_one else hits
        counting = [h for h in hits if unit_of and _counts(body, h, unit_of)]
        # "how many days": the one number that counts days picks its clause ("lasted 15
        # days", not "on 7 November 1956")
        picked = 0 < len(counting) < len(hits)
        hits = counting if picked else hits
        picked = picked or priced_one
        if ask is not Ask.OTHER and hits:
            # The document's subject is in every clause: its words pick none of them ("They were
            # replaced in England by Early Modern English, in Scotland by Early Scots" asked of
            # Middle English in Scotland).
            clause = _clause(body, hits, wanted - title, names - title, picked=picked, kin=kin)
            if clause is not None:
                focus = (u.span[0] + clause[0], u.span[0] + clause[1])
                focus_text = body[clause[0] : clause[1]]
    rest = wanted - names - context
    predicate = len(rest & own) / len(rest) if rest else 1.0
    score = (
        share
        + weights.dense * prior
        + (weights.kind if found else 0.0)
        + (weights.names if names and names_in_unit else 0.0)
        + weights.predicate * (predicate if rest else 0.0)
        + (weights.naming if naming and names_something(body) else 0.0)
    )
    return _Scored(passage, u, score, share, own_share, names_found, found, predicate, focus,
                   None, focus_text)  # fmt: skip


_DEMONYM = re.compile(r"[A-Z][a-z]{3,}(?:ish|ese|ian|an|ic)")
_ACRONYM = re.compile(r"[A-Z][A-Za-z]{1,5}")
_CAPITALISED = re.compile(r"[A-Z][^\W\d_]*")
_VERSION = re.compile(r"\d+(?:\.\d+)+")


# Countries and unions a document and a question name differently ("staff in Britain" and
# "in the United Kingdom"), as written (case counts: "US", not "us").
_COUNTRIES = (
    ("United Kingdom", "UK", "U.K.", "Britain", "Great Britain", "British"),
    ("United States", "US", "U.S.", "USA", "America", "American"),
    ("European Union", "EU"),
    ("Netherlands", "Holland", "Dutch"),
)
_COUNTRY_NAMES = [
    re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(a) for a in names) + r")(?![\w])")
    for names in _COUNTRIES
]


def _kin(question: str, names: set[str]) -> dict[str, tuple[str, str]]:
    """The question's names another word may stand for, by their term: a country by its other
    names ("Britain": "United Kingdom", "UK"), a people's adjective by its country
    ("Scottish": a capitalised word starting "Scot"), an acronym by the capitalised words it
    takes its capitals from ("MoMA": "Museum of Modern Art"), a version by its releases
    ("4.1": "4.1.0", "4.1.2"; not "4.10")."""
    out = {}
    for k, country in enumerate(_COUNTRY_NAMES):
        for m in country.finditer(question):
            for term in {stem(w.lower()) for w in WORD.findall(m.group(0))} & names:
                out[term] = ("country", str(k))
    for m in WORD.finditer(question):
        w = m.group(0)
        n = stem(w.lower())
        if n not in names or n in out:
            continue
        if _DEMONYM.fullmatch(w):
            out[n] = ("prefix", w[:4].lower())
        elif _ACRONYM.fullmatch(w) and sum(c.isupper() for c in w) >= 3:
            out[n] = ("initials", "".join(c for c in w if c.isupper()))
        elif _VERSION.fullmatch(w):
            out[n] = ("release", w + ".")
    return out


def _called(kin: tuple[str, str], text: str) -> bool:
    how, key = kin
    if how == "country":
        return _COUNTRY_NAMES[int(key)].search(text) is not None
    if how == "release":
        return any(w.startswith(key) for w in WORD.findall(text))
    if how == "prefix":
        return any(w.lower().startswith(key) for w in _CAPITALISED.findall(text))
    # The initials of each run of capitalised words, function words skipped within it.
    words = [w for w in WORD.findall(text) if w.lower() not in STOP]
    initials = "".join(w[0] if w[0].isupper() else " " for w in words)
    return any(key in run for run in initials.split())


def _columns(u: Unit, wanted: set[str]) -> list[int]:
    """The data columns of row `u` the question names most (by their header's terms): one, a
    tie, or every data column when it names none."""
    headers = [terms(column) for column in u.header[1 : len(u.cells)]]
    hits = [len(t & wanted) for t in headers]
    most = max(hits, default=0)
    tied = [n for n, h in enumerate(hits, start=1) if h == most]
    if most and len(tied) > 1:
        # As many of the question's words in each: the header the question says most of, the
        # shortest ("half pay parental leave" names "Half pay" whole, "Partner leave (full
        # pay)" half).
        shortest = min(len(headers[n - 1]) for n in tied)
        tied = [n for n in tied if len(headers[n - 1]) == shortest]
    return tied


def _named(u: Unit, columns: list[int]) -> bool:
    """Whether the header gives every one of `columns` a name to compare the question with."""
    return all(n < len(u.header) and u.header[n].strip() for n in columns)


def _cell_text(text: str, u: Unit, cell: tuple[int, int]) -> str:
    """A cell of row `u` as the answer says it: "row, column: cell"."""
    label = text[u.cells[0][0] : u.cells[0][1]]
    return f"{label}, {u.header[u.cells.index(cell)]}: {text[cell[0] : cell[1]]}"


def _by_meaning(
    question: str,
    wanted: set[str],
    text: str,
    s: _Scored,
    ask: Ask,
    similar: Callable[[str, list[str]], Sequence[float]],
    how: How = "",
) -> None:
    """When the question's words name no one column of the chosen row ("If I pay month by
    month, ..." against "Annual billing" and "Monthly billing"), the column whose header is
    closest to the question in the embedding model's space."""
    u = s.unit
    columns = _columns(u, wanted)
    if len(columns) < 2 or not _named(u, columns):
        return
    columns = [n for n in columns if _holds(text, u.cells[n], ask, how)] or columns
    if len(columns) < 2:
        return
    cosines = similar(question, [u.header[n] for n in columns])
    cell = u.cells[columns[max(range(len(columns)), key=lambda k: cosines[k])]]
    s.focus, s.focus_text = cell, _cell_text(text, u, cell)
    s.kind = ask is Ask.OTHER or _holds(text, cell, ask, how)


def _holds(text: str, cell: tuple[int, int], ask: Ask, how: How = "") -> bool:
    """Whether the cell holds what the question asks for, narrowed by `how`."""
    said = text[cell[0] : cell[1]]
    if how == "often":
        return bool(frequencies(said))
    hits = candidates(said, ask, set())
    if how == "clock":
        return any(clock(said[a:b]) for a, b in hits)
    return bool(hits)


_CLAUSE_END = re.compile(r"[;\t]\s*|,\s+|\s+(?:and|or|while|whereas|but)\s+")


def _joins_names(body: str, start: int, end: int) -> bool:
    """Whether the conjunction at [start, end) stands between two capitalised words: it
    joins names ("the Central and Mountain West regions"), not clauses."""
    before = body[max(0, start - 40) : start].split()
    return bool(before) and before[-1][:1].isupper() and body[end : end + 1].isupper()


# "6.2.3 or later", "14 days or more": the conjunction bounds the value, it ends no clause.
_BOUNDS = frozenset(
    "later earlier newer older more less fewer higher lower above below greater over".split()
)


def _joins_range(body: str, start: int, end: int, conjunction: str) -> bool:
    """Whether the conjunction at [start, end) is part of one value: "between 04:00 and
    06:00" (an "and" within four words of "between"), "version 6.2.3 or later"."""
    if conjunction == "and":
        before = [w.lower() for w in body[max(0, start - 60) : start].split()[-4:]]
        return "between" in before
    if conjunction == "or":
        after = body[end : end + 12].split()
        return bool(after) and after[0].lower().strip(".,;") in _BOUNDS
    return False


def _appositive(body: str, s: int, e: int, hits: list[tuple[int, int]], names: set[str]) -> bool:
    """Whether the clause [s, e) after a comma is no more than an answer candidate and a word
    or two, none of them a name the question gives ("staffed Monday to Friday, 08:00-20:00
    CET"): it belongs to the clause before ("..., Business accounts 6" is a clause of its
    own when the question asks about Business accounts)."""
    inside = [(a, b) for a, b in hits if s <= a < e]
    if not inside:
        return False
    rest = body[s:e]
    for a, b in sorted(inside, reverse=True):
        rest = rest[: a - s] + rest[b - s :]
    return len(WORD.findall(rest)) <= 2 and not terms(rest) & names


def _names_another(body: str, s: int, e: int, hits: list[tuple[int, int]]) -> bool:
    """Whether the clause [s, e) holds a capitalised word of its own (not an answer
    candidate, not the start of `body`): a subject other than the sentence's."""
    return any(
        m.group(0)[:1].isupper() and s + m.start() > 0
        and not any(a <= s + m.start() < b for a, b in hits)
        for m in WORD.finditer(body[s:e])
    )  # fmt: skip


def _counts(body: str, hit: tuple[int, int], unit: frozenset[str]) -> bool:
    """Whether the number at `hit` may count what `unit` holds (stemmed words, `counted`):
    one of them follows within two words, or nothing does ("Business accounts 6 and
    Enterprise accounts 20"), where another word would say it counts something else ("on 7
    November")."""
    after = WORD.findall(body[hit[1] : hit[1] + 40])[:2]
    return not after or after[0].lower() in STOP or any(stem(w.lower()) in unit for w in after)


def _clause(
    body: str,
    hits: list[tuple[int, int]],
    wanted: set[str],
    names: set[str],
    *,
    picked: bool = False,
    kin: dict[str, tuple[str, str]] | None = None,
) -> tuple[int, int] | None:
    """The clause of `body` that holds an answer candidate and most of the question's names,
    then terms ([start, end) in `body`), when exactly one does best; `picked`: the one
    candidate is already known to be the answer (it counts what is asked); `kin`: the names
    another word may stand for (_kin)."""
    bounds = [0]
    for m in _CLAUSE_END.finditer(body):
        word = m.group(0).strip()
        if word in ("and", "or") and (
            _joins_names(body, m.start(), m.end()) or _joins_range(body, m.start(), m.end(), word)
        ):
            continue
        bounds += [m.start(), m.end()]
    bounds.append(len(body))
    clauses: list[tuple[int, int]] = []
    for k in range(0, len(bounds) - 1, 2):
        s, e = bounds[k], bounds[k + 1]
        after_comma = body[bounds[k - 1] : s].startswith(",")
        if clauses and after_comma and _appositive(body, s, e, hits, names):
            clauses[-1] = (clauses[-1][0], e)
        else:
            clauses.append((s, e))
    scored = []
    rest = 0  # the most of the question's names a clause without a candidate holds
    subject: set[str] | None = None  # the question's names the first clause holds
    last: set[str] = set()  # ... the last clause that named something holds
    for s, e in clauses:
        if e <= s:
            continue
        own = terms(body[s:e])
        if kin:
            own |= {n for n in names - own if n in kin and _called(kin[n], body[s:e])}
        if subject is None:
            subject = last = own & names
        elif own & names or _names_another(body, s, e, hits):
            last = own & names
        elif not _CAPITALISED.search(body, s, e):
            # "the Starter plan costs £16 or $21 per user per month": a clause with no
            # capitalised word goes on with the last clause that named something.
            own |= last
        else:
            # "MFA has been compulsory for all staff since 1 March 2024 and for all students
            # since 1 September 2024": a clause that names nothing is about the subject.
            own |= subject
        if not any(s <= a < e for a, _ in hits):
            rest = max(rest, len(own & names))
            continue
        scored.append((len(own & names), len(own & wanted), s, e))
    if len(scored) == 1 and len(hits) == 1:
        # One clause holds the only candidate: it is the answer when it holds more of the
        # question's names than any other clause ("Business accounts include 10 free viewer
        # seats, Enterprise accounts include unlimited free viewer seats, ...").
        named, _, s, e = scored[0]
        parallel = len(clauses) > 1 and (picked or named > rest)
        return (s, e) if parallel else None
    if len(scored) < 2:
        return None
    scored.sort(reverse=True)
    # A name of the question's that one clause holds and no other picks it out ("...,
    # Business accounts 6 and Enterprise accounts 20"); when no name does, the question's
    # other words may ("book flights at least 14 days before departure and hotels at least
    # 10 days before arrival"), if one clause holds more of them than any other.
    top, second = scored[0], scored[1]
    by_words = top[0] == second[0] and top[1] > second[1] and top[1] > 0
    if (top[0] == 0 or top[0] == second[0]) and not by_words:
        return None
    _, _, s, e = top
    return (s, e)
