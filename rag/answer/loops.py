"""Telling when an answer has begun to say again what it already said.

Two signs, both for the repetition stop (finish reason `repetition`):

- the engine's: its last REPEAT_NGRAM generated tokens were generated before
  (rag.engine.sequence), which catches long runs but lets a short sentence come back whole;
- the answer path's, here, on words (ignoring case, punctuation, articles and citation
  markers, so that line breaks and tokenization do not hide a repeat): a new sentence that
  starts as an earlier one of four words or more did (its first PREFIX_WORDS words, or all of
  a shorter one), a run of RUN_WORDS words written again, or one of SHORT_RUN_WORDS written a
  third time. The answer is stopped a few words into the repeat.

Either way the repeated tail has been streamed already; `answer` leaves it out and `repeated`
says where it lies in the streamed text, for a client to hide.
"""

from __future__ import annotations

import re

from rag.answer.cite import MARKER, Span, sentences

SHORTEST_WORDS = 4  # a shorter sentence ("Yes.") may come back without being a loop
PREFIX_WORDS = 6  # this many words of a new sentence, as an earlier one began, make a repeat
RUN_WORDS = 10  # a run this long written again is a loop wherever it starts
SHORT_RUN_WORDS = 8  # and one this long written a third time

_WORD = re.compile(r"\w+")
_ARTICLES = frozenset({"a", "an", "the"})


def spans_of_words(text: str) -> list[tuple[str, int]]:
    """The words of `text` (lowercased; no articles, none inside citation markers) with
    where each starts."""
    clean = MARKER.sub(lambda m: " " * len(m.group(0)), text)
    out = []
    for m in _WORD.finditer(clean):
        w = m.group(0).lower()
        if w not in _ARTICLES:
            out.append((w, m.start()))
    return out


def words(text: str) -> list[str]:
    return [w for w, _ in spans_of_words(text)]


def repeat_start(text: str) -> int | None:
    """Where `text` began to repeat itself (a sentence or a run, see above), or None."""
    at = repeating_sentence(text)
    if at is None:
        found = spans_of_words(text)
        at = repeating_run(found, RUN_WORDS, 1)
        if at is None:
            at = repeating_run(found, SHORT_RUN_WORDS, 2)
    return at


def repeating_run(found: list[tuple[str, int]], n: int, before: int) -> int | None:
    """Where the last `n` of these words (spans_of_words) start, when they were written
    `before` times already; else None."""
    if len(found) < (before + 1) * n:
        return None
    said = [w for w, _ in found]
    last = tuple(said[-n:])
    times = sum(
        1 for i in range(len(said) - n) if said[i] == last[0] and tuple(said[i : i + n]) == last
    )
    return found[-n][1] if times >= before else None


def repeating_sentence(text: str) -> int | None:
    """Where the last sentence of `text` (finished or not) starts, when it begins as an
    earlier sentence of SHORTEST_WORDS words or more did; else None."""
    spans = sentences(text)
    if len(spans) < 2:
        return None
    start, end = spans[-1]
    last = words(text[start:end])
    if len(last) < SHORTEST_WORDS:
        return None
    for s, e in spans[:-1]:
        earlier = words(text[s:e])
        if len(earlier) < SHORTEST_WORDS:
            continue
        n = min(len(earlier), PREFIX_WORDS)
        if len(last) >= n and last[:n] == earlier[:n]:
            return start
    return None


def repeated_tail(answer: str, shortest: int = 8) -> int | None:
    """Where the longest end of `answer` (at least `shortest` characters) that starts earlier
    in it too begins: what a loop wrote again before the engine stopped it."""
    best = None
    size = shortest
    while size < len(answer) and answer.find(answer[-size:]) < len(answer) - size:
        best = len(answer) - size
        size += 1
    return best


def cut(streamed: str, at: int | None) -> tuple[str, Span | None]:
    """The answer without its repeated tail from `at`, and the tail's span in `streamed`."""
    if at is None:
        return streamed, None
    return streamed[:at].rstrip(), (at, len(streamed))
