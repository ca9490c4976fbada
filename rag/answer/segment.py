"""Sentences of document text, by a segmenter that knows abbreviations and initials.

Passages are split with sentencex (Wikimedia's rule-based segmenter, linear time): "novels by
C. S. Lewis" and "produced by David O. Selznick" stay one sentence, as do "e.g." and "U.S.".
A line break ends a sentence too (a heading, a table row or a list item is one), except after
a line without closing punctuation where the next line starts in lower case, or where that
line is long and the next is no list item or numbered heading: a sentence that a PDF's
layout wrapped. The text is bounded
before it is split (a chunk is bounded in tokens, not characters), and a "sentence" past
MAX_SENTENCE_CHARS is cut at whitespace so that no later step sees an unbounded one.
"""

from __future__ import annotations

import re

from sentencex import segment

from rag.embed.base import bounded

Span = tuple[int, int]  # [start, end) in the text's characters

# Longer passage texts are split only this far; the rest is one last piece, cut below.
MAX_TEXT_CHARS = 20_000
MAX_SENTENCE_CHARS = 600
# A line at least this long that ends without punctuation was wrapped by a layout.
WRAPPED_LINE_CHARS = 60
# A list item or a numbered heading: "- ", "* ", "• ", "3. ", "4.3 ", "2) ".
_LIST_ITEM = re.compile(r"[-*•]\s|\d{1,2}(?:\.\d{1,2}){0,3}[.)]?\s")


def sentence_spans(text: str, language: str = "en") -> list[Span]:
    """[start, end) of each sentence of `text`, without surrounding whitespace."""
    head = text[:MAX_TEXT_CHARS]
    pieces = [p for block in _blocks(head) for p in segment(language, block)]
    if len(text) > MAX_TEXT_CHARS:
        pieces.append(text[MAX_TEXT_CHARS:])
    out: list[Span] = []
    at = 0
    for piece in pieces:
        # sentencex returns the text in order, whitespace included: find keeps us honest
        # should a version ever normalise a piece.
        found = text.find(piece, at)
        start = found if found >= 0 else at
        end = start + len(piece)
        at = end
        for s, e in bounded(text, start, end, MAX_SENTENCE_CHARS):
            while s < e and text[s].isspace():
                s += 1
            while e > s and text[e - 1].isspace():
                e -= 1
            if s < e:
                out.append((s, e))
    return out


def _blocks(text: str) -> list[str]:
    """`text` cut after each line break that ends a sentence, the pieces in order (their
    concatenation is `text`)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    for line in lines:
        if out and _continues(out[-1], line):
            out[-1] += line
        else:
            out.append(line)
    return [b for b in out if b.strip()]


def _continues(block: str, line: str) -> bool:
    """Whether `line` goes on with the sentence `block` ends with (a wrapped line): after a
    line without closing punctuation, a line in lower case, or any line after a long one
    (a layout's wrap: "all offices close at" / "13:00.") but a list item or a numbered
    heading ("4.3 Sick leave")."""
    before = block.rstrip()
    after = line.lstrip()
    if not before or before[-1] in ".!?:;|" or not after:
        return False
    if after[:1].islower():
        return True
    last = before.rsplit("\n", 1)[-1]
    return len(last) >= WRAPPED_LINE_CHARS and before[-1].isalnum() and not _LIST_ITEM.match(after)
