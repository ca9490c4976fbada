"""A follow-up made a stand-alone question before it is searched and answered.

"Which award did it win in 1966?" after "Who wrote the novel Dune?" means "Which award did
Dune win in 1966?"; "And in London?" after "How much can I spend on a hotel in Munich?" means
"How much can I spend on a hotel in London?". Searched as typed, neither finds its document.
The rewrite here is rules over the question's words, no generator (the bundled 135M model
rewrites questions that needed no rewrite; bench/conversations.py measured both ways):

- a follow-up that refers back (it, its, they, their, he, she, there, ...) and names nothing
  of its own has each such word replaced by what the previous question named (for he / she,
  the person the previous answer named when the previous question asked "who");
- an elliptical follow-up ("And in London?", "What about Business accounts?", a question of
  three words or fewer) is the previous question with its last name (or number) swapped for
  the follow-up's; with nothing to swap, the previous question followed by the follow-up.

Anything else stands alone and is searched exactly as asked. The previous question is the
previous turn's own resolved question (what it searched), so a third turn resolves through
the second. The result is what the answer path searches, chooses its evidence for and puts in
the prompt's last line; the final event reports it (`searched_query`), and a request's
`rewrite: false` turns all of this off.

Every pattern here is linear: words are found by one scan (rag.answer.question.WORD) and
everything else works on the list of words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag.answer.cite import MARKER, STOP
from rag.answer.question import WORD, Ask, ask_of
from rag.errors import TooLarge

# Words that point back at something named before.
PERSON = frozenset("he him his she her hers himself herself".split())
THING = frozenset("it its itself they them their theirs themselves there".split())
POSSESSIVE = frozenset("its his their hers theirs".split())
_COPULA = frozenset("is was isn't wasn't be 's".split())
_BE = frozenset("is are was were be been will would isn't aren't 's".split())
_CLAUSE = frozenset("to that for whether if".split())
_ARTICLES = frozenset("the a an his her its their our my your this that".split())
_DUMMY_VERBS = frozenset("take takes took cost costs seem seems appear appears matter".split())
# An opening that continues the previous question ("And for Stockholm?").
_OPENING = re.compile(
    r"\s{0,20}(?:and|or|but|also|plus|then|what about|how about|what of|same (?:for|in|with|at)"
    r"|now for|now in)\b[\s,]{0,20}",
    re.IGNORECASE,
)
# Words that may join a name's capitalised words ("Bank of England", "The Lord of the
# Rings", "To Kill a Mockingbird"; at most two in a row), and what may start a title.
_JOINERS = frozenset("of the a an in with de da di del la le du von van and &".split())
_TITLE_STARTS = frozenset(("The", "A", "An", "To", "One"))
# How a capitalised adjective of nationality ends ("English", "Japanese", "Italian").
_DEMONYM = ("ish", "ese", "ian", "an", "ch")
_WH = frozenset("what which who whom whose when where why how".split())
# Capitalised words that start a question or an order, never a name.
_OPENERS = frozenset(
    """what which who whom whose when where why how is are was were do does did can could
    will would should shall may might must has have had tell name list give show describe
    explain please compare summarise summarize define roughly approximately any in on at for
    from by to of a an the""".split()
)
# The words a question (not a fragment) starts with.
_ASKING = frozenset(
    """what which who whom whose when where why how is are was were do does did can could
    will would should has have had""".split()
)
SHORT = 3  # words: a follow-up this short is elliptical ("Stockholm?", "In London?")
# The longest question a rewrite may make (a question's own limit): past it, as asked.
MAX_CHARS = 4000


@dataclass(frozen=True)
class Turn:
    """An earlier turn of the conversation: what was asked, what was answered, and what it
    searched (stored turns know it; turns a client sends are resolved again)."""

    question: str
    answer: str = ""
    searched: str | None = None


@dataclass(frozen=True)
class Resolved:
    query: str  # what is searched, chosen evidence for, and asked in the prompt
    how: str  # "as_asked" | "reference" | "ellipsis" | "off" (rewriting turned off)

    @property
    def rewritten(self) -> bool:
        return self.how in ("reference", "ellipsis")


@dataclass(frozen=True)
class _Word:
    text: str
    start: int
    end: int
    named: bool  # a capitalised word past the question's opening, or a number


def check_bounds(turns: Sequence[Turn], max_turns: int, max_chars: int) -> None:
    """Refuse (HTTP 413) a history past what one request may carry."""
    if len(turns) > max_turns:
        raise TooLarge(
            f"history holds {len(turns)} turns; at most {max_turns} may be sent",
            detail={"limit": "history_turns", "max": max_turns, "got": len(turns)},
        )
    chars = sum(len(t.question) + len(t.answer) for t in turns)
    if chars > max_chars:
        raise TooLarge(
            f"history holds {chars} characters; at most {max_chars} may be sent",
            detail={"limit": "history_chars", "max": max_chars, "got": chars},
        )


def resolve(question: str, history: Sequence[Turn], *, rewrite: bool = True) -> Resolved:
    """The question to search and answer for `question` after `history` (oldest first)."""
    if not rewrite:
        return Resolved(question, "off")
    if not history:
        return Resolved(question, "as_asked")
    previous = searched_queries(history)[-1]
    resolved = _resolve(question, previous, history[-1].answer)
    return resolved if len(resolved.query) <= MAX_CHARS else Resolved(question, "as_asked")


def searched_queries(history: Sequence[Turn]) -> list[str]:
    """Each earlier turn's resolved question: its stored one, else resolved again through
    the turns before it (the rules are deterministic, so the same as when it was asked)."""
    out: list[str] = []
    for i, turn in enumerate(history):
        if turn.searched is not None:
            out.append(turn.searched)
        elif i == 0:
            out.append(turn.question)
        else:
            query = _resolve(turn.question, out[-1], history[i - 1].answer).query
            out.append(query if len(query) <= MAX_CHARS else turn.question)
    return out


def _resolve(question: str, previous: str, previous_answer: str) -> Resolved:
    opening = _OPENING.match(question)
    rest = question[opening.end() :] if opening else question
    words = _words(rest)
    asking = bool(words) and words[0].text.lower() in _ASKING
    continued = bool(opening) and asking  # "And who published it?": a question after "and"
    if continued:
        opening = None
    names = [w for w in words if w.named and not _numeric(w.text)]  # its own
    refers = [w for i, w in enumerate(words) if _refers(words, i)]
    # A name of its own before any word that points back answers it ("When did the Berlin
    # Wall fall, and who ordered it opened?"); one after does not ("When was it given to MoMA?").
    if opening is None and refers and (not names or refers[0].start < names[0].start):
        replaced = _replace_references(rest, refers, previous, previous_answer)
        if replaced is None:  # nothing named before to stand for them: search both
            return Resolved(_joined(rest, previous), "reference")
        return Resolved(replaced, "reference")
    if continued and not names:  # "And who wrote the screenplay?": of what it named
        named = _named(previous)
        if named:
            return Resolved(_attached(rest, named[-1]), "ellipsis")
        return Resolved(_joined(rest, previous), "ellipsis")
    if opening or (len(words) <= SHORT and not asking):
        if any(w.text.lower() in _WH for w in words):  # "In what year?": a new ask
            return Resolved(_joined(rest, previous), "ellipsis")
        return Resolved(_ellipsis(rest, previous), "ellipsis")
    return Resolved(question, "as_asked")


def _attached(rest: str, name: str) -> str:
    """A continued question about what the previous one named: "Who wrote the screenplay
    of Psycho?"."""
    head = rest.strip().rstrip("?").rstrip()
    return f"{head[:1].upper()}{head[1:]} of {name}?"


def _named(text: str) -> list[str]:
    """The names (not numbers) a question holds, in order."""
    return [p[2] for p in _phrases(text) if not _numeric(p[2])]


def _who_object(previous: str) -> list[str]:
    """What a "who" question that names nothing asked about, in lower case ("Who discovered
    palladium?": palladium)."""
    words = _words(previous)
    if len(words) >= 3 and words[0].text.lower() == "who" and words[1].text.lower() not in _BE:
        obj = words[2:]
        if len(obj) <= 4 and not any(w.text.lower() in _WH for w in obj):
            return [previous[obj[0].start : obj[-1].end]]
    return []


def _joined(rest: str, previous: str) -> str:
    """The follow-up first (its question word says what is asked), then the previous
    question (what it is about)."""
    head = rest.strip()
    head = head[:1].upper() + head[1:]
    if not head.endswith("?"):
        head += "?"
    return f"{head} {previous.strip()[: max(0, MAX_CHARS - len(head) - 1)]}"


def _refers(words: list[_Word], i: int) -> bool:
    """Whether the i-th word points back at something named before; "it" in "is it possible
    to", "it is worth ... to", "how long does it take" points at nothing."""
    lower = words[i].text.lower()

    def at(j: int) -> str:
        return words[j].text.lower() if 0 <= j < len(words) else ""

    if words[i].named:  # "IT", a name
        return False
    if lower in ("that", "this"):  # "Where was that done?", "Why did this happen?"
        return at(i - 1) in _ASKING
    if lower not in PERSON | THING:
        return False
    if lower == "there":  # "is there a limit", "there are two": nowhere in particular
        return not ({at(i - 1), at(i + 1)} & _BE)
    if lower != "it":
        return True
    # "is it possible to bring", not "was it donated to MoMA" (a preposition before a name
    # or an article).
    after = words[i + 3] if i + 3 < len(words) else None
    preposition = after is not None and (after.named or after.text.lower() in _ARTICLES)
    if at(i - 1) in _COPULA and at(i + 2) in _CLAUSE and not preposition:
        return False
    if at(i + 1) in _COPULA and _CLAUSE & {at(i + 3), at(i + 4)}:  # "it is hard to"
        return False
    return at(i + 1) not in _DUMMY_VERBS  # "does it take", "does it cost"


def _ellipsis(rest: str, previous: str) -> str:
    """The previous question with its last name swapped for the follow-up's first, when both
    have one of the same shape (a number for a number); else the two together."""
    new = _phrases(rest)
    old = _phrases(previous)
    if new:
        first = new[0]
        for start, end, text in reversed(old):
            if _numeric(text) == _numeric(first[2]):
                return previous[:start] + first[2] + previous[end:]
    tail = rest.strip().rstrip("?").strip()
    if not tail:
        return previous
    return f"{previous.rstrip()[: max(0, MAX_CHARS - len(tail) - 2)]} {tail}?"


def _replace_references(
    rest: str, refers: list[_Word], previous: str, previous_answer: str
) -> str | None:
    """Each kind of word that points back (a person, a thing, a place) replaced, at its first
    use, by what the previous turn named; None when it named nothing."""
    named = _named(previous)
    things = named or _who_object(previous)
    answered = [
        p[2]
        for p in _phrases(MARKER.sub(" ", previous_answer), question=False)
        if not _numeric(p[2])
    ]
    asked = {t.lower() for t in things}
    new = [n for n in answered if n.lower() not in asked]
    ask = ask_of(previous)
    # A person is named in full ("Artemisia Gentileschi", not "Florence"): the previous
    # question's, else the one the answer to "who ..." named, else anything named.
    full = [n for n in named if len(n.split()) > 1]
    people = full or (new if ask is Ask.PERSON else []) or things or new
    places = (new if ask is Ask.PLACE else []) or things
    things = things or ([] if ask is Ask.PERSON else new)
    out = []
    at = 0
    done: set[str] = set()
    for w in refers:
        lower = w.text.lower()
        kind = "person" if lower in PERSON else "place" if lower == "there" else "thing"
        names = {"person": people, "place": places, "thing": things}[kind]
        if not names or kind in done:
            continue
        done.add(kind)
        name = names[0] if kind == "person" else names[-1]
        if kind == "place":
            said = f"in {name}"
        elif lower in POSSESSIVE or (lower == "her" and _possessive_her(rest, w)):
            said = f"{name}'s"
        else:
            said = name
        out.append(rest[at : w.start] + said)
        at = w.end
    if not out:
        return None
    out.append(rest[at:])
    text = "".join(out).strip()
    return text[:1].upper() + text[1:]


def _possessive_her(text: str, w: _Word) -> bool:
    """ "her novel" (possessive) against "did they marry her" (object): a content word
    follows."""
    m = WORD.search(text, w.end, min(len(text), w.end + 100))
    return m is not None and m.group(0).lower() not in STOP and text[w.end : m.start()].isspace()


def _words(text: str, question: bool = True) -> list[_Word]:
    found = [(m.group(0), m.start(), m.end()) for m in WORD.finditer(text)]
    out = []
    for i, (w, start, end) in enumerate(found):
        lower = w.lower().removesuffix("'s")
        nxt = found[i + 1][0] if i + 1 < len(found) else ""
        capital = w[:1].isupper() and w != "I" and lower not in STOP and lower not in _OPENERS
        capital = capital or (len(w) > 1 and w.isupper() and w.isalpha())  # "IT", "UK"
        if capital and question and i == 0 and nxt and not (nxt[:1].isupper() or _numeric(nxt)):
            capital = False  # a capital that only starts the question ("Near which town")
        if capital and lower.endswith(_DEMONYM) and nxt[:1].islower() and nxt not in STOP:
            capital = False  # "English king", "British magazine": an adjective
        out.append(_Word(w, start, end, capital or any(ch.isdigit() for ch in w)))
    return out


def _phrases(text: str, question: bool = True) -> list[tuple[int, int, str]]:
    """Runs of named words (joined by "of", "the", ...; a title's leading "The" or "To"
    kept) as (start, end, text), without a closing possessive."""
    words = _words(text, question)
    out: list[tuple[int, int, str]] = []
    i = 0
    while i < len(words):
        if not words[i].named:
            i += 1
            continue
        j = i
        while j + 1 < len(words):
            k = j + 1
            while k < len(words) and k - j <= 2 and words[k].text.lower() in _JOINERS:
                k += 1
            if k < len(words) and words[k].named:
                j = k
            else:
                break
        first = i
        if i > 0 and words[i - 1].text in _TITLE_STARTS:
            first = i - 1
        start, end = words[first].start, words[j].end
        if text[end - 2 : end] == "'s":
            end -= 2
        out.append((start, end, text[start:end]))
        i = j + 1
    return out


def _numeric(text: str) -> bool:
    """A number, a version, a date of digits: every word of it holds a digit."""
    return all(any(ch.isdigit() for ch in w) for w in text.split())


def prompt_turns(history: Sequence[Turn], max_turns: int, max_chars: int) -> list[Turn]:
    """The turns the prompt carries: the latest `max_turns`, the oldest dropped first until
    their text fits `max_chars`; each question as it was searched, each answer without its
    citation markers."""
    queries = searched_queries(history)
    turns = [
        Turn(q, " ".join(MARKER.sub(" ", t.answer).split()))
        for q, t in zip(queries, history, strict=True)
    ][-max_turns:] if max_turns else []  # fmt: skip
    while turns and sum(len(t.question) + len(t.answer) for t in turns) > max_chars:
        turns.pop(0)
    return turns
