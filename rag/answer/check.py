"""The check of a generated sentence against its evidence, before it is shown.

A grounded answer streams the quote (the sentence that answers, verified by construction)
first, then one generated sentence, held until it is complete and shown only if it passes:

- every name and number it states (capitalised words past its first, digits) stands in the
  passage or in the question: nothing from elsewhere reaches the user as a cited fact;
- what it adds to the question (its names and numbers the question does not hold) stands in
  the quote: the sentence says what the quote says, not a neighbouring fact of the same
  passage (the film's director for its producer);
- most of its content words (MIN_SUPPORT) stand in the passage or the question;
- it is not a hedge ("the passage does not say") next to a quote that does say.

Nothing streamed is withdrawn: a sentence that fails is never shown, and the answer is the
quote alone (answer_source "quoted").
"""

from __future__ import annotations

import re

from rag.answer.cite import MARKER, STOP, stem, terms
from rag.answer.question import WORD
from rag.answer.segment import sentence_spans

_HEDGE = re.compile(
    r"\b(?:i don'?t know|i do not know|not (?:explicitly )?(?:mentioned|stated|specified|given|"
    r"provided|say|said)|does not (?:say|state|mention|specify)|doesn'?t (?:say|state|mention)|"
    r"no information|cannot (?:answer|determine|be determined)|unclear|not clear)\b",
    re.IGNORECASE,
)
# Links and images are never part of a short answer (a document could ask for one).
_LINK = re.compile(r"\]\(|https?:|www\.|<\s*/?\s*\w", re.IGNORECASE)
# The least share of the sentence's content words the passage and the question must hold.
MIN_SUPPORT = 0.5
# A generated sentence longer than this is not a short answer: it is not checked, not shown.
MAX_SENTENCE_CHARS = 400


def _key(words: list[str]) -> set[str]:
    """Names and numbers among `words` (stemmed, lower case): capitalised words that are not
    function words (the first one too: "Fleming produced it"), anything with a digit."""
    out = set()
    for w in words:
        lower = w.lower()
        if any(ch.isdigit() for ch in w) or (w[:1].isupper() and lower not in STOP):
            out.add(stem(lower))
    return out


def _all(text: str) -> set[str]:
    return {stem(w.lower()) for w in WORD.findall(text)}


def passes(sentence: str, *, question: str, passage: str, quote: str) -> bool:
    """Whether the generated `sentence` may be shown after `quote` (see the module's text)."""
    text = MARKER.sub(" ", sentence).strip()
    if not text or len(text) > MAX_SENTENCE_CHARS or _HEDGE.search(text) or _LINK.search(text):
        return False
    words = WORD.findall(text)
    if len(words) < 2:
        return False
    stated = _key(words)
    asked = _all(question)
    if not stated <= (_all(passage) | asked):
        return False
    said = terms(text)
    if said and len(said & (terms(passage) | terms(question))) / len(said) < MIN_SUPPORT:
        return False
    return (stated - asked) <= _all(quote)


_MARKERS_AFTER = re.compile(r"(?:\s*\[\d{1,4}(?:\s*,\s*\d{1,4})*\])+")


def first_sentence(text: str, *, finished: bool = False) -> int | None:
    """Where the first sentence of streamed `text` ends (after its markers), once the next
    one has begun or the text is `finished`; None while it may still be being written.
    Sentences are split as passages are (rag.answer.segment: initials and abbreviations
    such as "C. S. Lewis" and "Dr." do not end one)."""
    spans = sentence_spans(text)
    if not spans or (len(spans) < 2 and not finished):
        return None
    end = spans[0][1]
    more = _MARKERS_AFTER.match(text, end)
    return more.end() if more else end
