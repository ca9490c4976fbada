"""Citations: the answer's [n] markers mapped to the passages given, re-checked in SQL.

A marker that points nowhere, or to a chunk deleted since or never the caller's, is dropped.
An answer with no usable marker (small models often write none) is attributed to the given
passages most of its words come from, flagged as attributed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag.db import Database, chunks
from rag.retrieve import Passage

MARKER = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]")
_CONTENT_WORD = re.compile(r"[^\W\d_]{4,}", re.UNICODE)
ATTRIBUTION_MIN_WORDS = 4
ATTRIBUTION_MIN_SHARE = 0.6


@dataclass(frozen=True)
class Citation:
    marker: int
    chunk_id: int
    document_id: str
    filename: str
    start_char: int
    end_char: int
    # False: the answer wrote [n]. True: it wrote no marker, and the server attributed it to a
    # given passage that most of the answer's words come from.
    attributed: bool = False


def markers(answer: str) -> list[int]:
    """The passage numbers the answer cites, in order of first appearance."""
    seen: list[int] = []
    for m in MARKER.finditer(answer):
        for part in m.group(1).split(","):
            n = int(part)
            if n not in seen:
                seen.append(n)
    return seen


def cite(
    db: Database, tenant_id: str, collection_id: str, given: Sequence[Passage], answer: str
) -> list[Citation]:
    """The answer's citations among the passages `given` (numbered from 1) that the tenant
    may still see."""
    wanted = [(n, given[n - 1]) for n in markers(answer) if 1 <= n <= len(given)]
    attributed = not wanted
    if attributed:
        wanted = attribute(answer, given)
    if not wanted:
        return []
    with db.read() as session:
        visible = chunks.visible_ids(
            session, tenant_id, collection_id, sorted({p.chunk_id for _, p in wanted})
        )
    return [
        Citation(n, p.chunk_id, p.document_id, p.filename, p.start_char, p.end_char, attributed)
        for n, p in wanted
        if p.chunk_id in visible
    ]


def attribute(answer: str, given: Sequence[Passage]) -> list[tuple[int, Passage]]:
    """Given passages (numbered from 1) that supply at least 60% of the answer's content
    words, best first, at most two. Nothing for a short or unsupported answer: a refusal or
    an answer from outside the passages gets no citation rather than a wrong one."""
    words = {w.lower() for w in _CONTENT_WORD.findall(answer)}
    if len(words) < ATTRIBUTION_MIN_WORDS:
        return []
    scored = []
    for n, passage in enumerate(given, start=1):
        share = len(words & {w.lower() for w in _CONTENT_WORD.findall(passage.text)}) / len(words)
        if share >= ATTRIBUTION_MIN_SHARE:
            scored.append((share, n, passage))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [(n, passage) for _, n, passage in scored[:2]]
