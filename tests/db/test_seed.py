"""rag/db/seed.py's pure part: passages laid out as one document's text and chunks (the
written path is exercised by every tests/db test through conftest's seeding)."""

from __future__ import annotations

from rag.db import seed


def test_joined_passages_are_chunks_at_their_spans() -> None:
    text, rows = seed.joined(["first passage.", "second one", "third"], sep="\n\n")
    assert text == "first passage.\n\nsecond one\n\nthird"
    assert [r.ordinal for r in rows] == [0, 1, 2]
    assert [text[r.start_char : r.end_char] for r in rows] == [r.text for r in rows]
    assert [r.token_count for r in rows] == [2, 2, 1]
