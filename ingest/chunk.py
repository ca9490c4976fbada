"""Token-aware chunking with the embedding model's own tokenizer.

The text is tokenized once; chunks are windows of at most `max_tokens` tokens, so the model
never truncates one. A window ends at the best boundary near its end (paragraph, line,
sentence, word) and the next one starts `overlap` tokens earlier. Offsets always index into
the original text: `text[chunk.start_char:chunk.end_char] == chunk.text`.

Chunks are bounded in characters as well (`max_chars`): one token can be any length (a
300,000-character word is a single `[UNK]`), so a token longer than a quarter of the bound is
cut into pieces first, a window ends before it passes the bound, and the overlap is at most
half the bound, so the stored text stays within a small multiple of the document.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Span = tuple[int, int]
TokenSpans = Callable[[str], list[Span]]

# Boundary strengths, and how far back in a window (as a fraction of max_tokens) each is
# worth ending early for.
_PARAGRAPH, _LINE, _SENTENCE, _WORD, _PUNCT, _NONE = 5, 4, 3, 2, 1, 0
_EARLIEST = {_PARAGRAPH: 0.5, _LINE: 0.65, _SENTENCE: 0.65, _WORD: 0.8, _PUNCT: 0.8}
_SENTENCE_END = frozenset(".!?;:\u3002\uff01\uff1f\u2026")
_CLOSERS = frozenset("\"')]}\u201d\u2019")


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    ordinal: int
    start_char: int
    end_char: int
    text: str
    token_count: int


def chunk_text(
    text: str, token_spans: TokenSpans, max_tokens: int, overlap: int, max_chars: int | None = None
) -> list[ChunkSpan]:
    """Split `text` into overlapping chunks of at most `max_tokens` tokens and, when given,
    at most `max_chars` characters."""
    if max_tokens < 1 or not 0 <= overlap < max_tokens:
        raise ValueError("need max_tokens >= 1 and 0 <= overlap < max_tokens")
    if max_chars is not None and max_chars < 4:
        raise ValueError("need max_chars >= 4")
    spans = [(a, b) for a, b in token_spans(text) if b > a]
    if max_chars is not None:
        spans = _cut_long_tokens(spans, max_chars // 4)
    ends = [b for _, b in spans]
    chunks: list[ChunkSpan] = []
    start, n, done = 0, len(spans), 0  # tokens before `done` are in a chunk already
    while start < n:
        limit = min(start + max_tokens, n)
        if max_chars is not None:  # the last token ending within max_chars of the start
            reach = bisect.bisect_right(ends, spans[start][0] + max_chars)
            limit = min(limit, max(start + 1, done + 1, reach))
        end = _window_end(text, spans, start, limit, max_tokens, done + 1)
        end = _fit(text, spans, start, end, token_spans, max_tokens)
        chunk = _make_chunk(text, spans, start, end, len(chunks))
        if chunk is not None:
            chunks.append(chunk)
        if end >= n:
            break
        done = end
        start = _next_start(text, spans, start, end, overlap)
        if max_chars is not None:
            # The overlap is at most half the bound, and the next window must reach past
            # this one: where a wide gap follows, it starts afresh.
            start = max(start, bisect.bisect_left(ends, ends[end - 1] - max_chars // 2, lo=start))
            if start > end or ends[end] - spans[start][0] > max_chars:
                start = end
    return chunks


def _cut_long_tokens(spans: list[Span], piece: int) -> list[Span]:
    """Tokens longer than `piece` characters as pieces of at most that length."""
    if all(b - a <= piece for a, b in spans):
        return spans
    out: list[Span] = []
    for a, b in spans:
        out.extend((i, min(i + piece, b)) for i in range(a, b, piece))
    return out


def _window_end(
    text: str, spans: list[Span], start: int, limit: int, max_tokens: int, floor: int
) -> int:
    """The token index to end the window at (exclusive), at the best boundary near `limit`
    (the window's last possible end: `max_tokens` on, or fewer where characters run out),
    and never before `floor` (past the previous window's end)."""
    if limit == len(spans):
        return limit
    size = min(limit - start, max_tokens)
    lowest = max(floor, start + max(1, int(size * min(_EARLIEST.values()))))
    best_end, best_rank = limit, _NONE
    for k in range(limit, lowest - 1, -1):
        rank = _boundary(text, spans, k)
        if rank > best_rank and k >= start + max(1, int(size * _EARLIEST[rank])):
            best_end, best_rank = k, rank
            if rank == _PARAGRAPH:
                break
    return best_end


def _boundary(text: str, spans: list[Span], k: int) -> int:
    """How good a place to cut between token k-1 and token k is."""
    prev_end, next_start = spans[k - 1][1], spans[k][0]
    gap = text[prev_end:next_start]
    if gap.count("\n") >= 2 and not gap.strip():
        return _PARAGRAPH
    if "\n" in gap:
        return _LINE
    last = text[prev_end - 1]
    if gap and last in _CLOSERS and prev_end >= 2:
        last = text[prev_end - 2]
    if gap and last in _SENTENCE_END:
        return _SENTENCE
    if gap:
        return _WORD
    if not (text[prev_end - 1].isalnum() and text[next_start].isalnum()):
        return _PUNCT
    return _NONE


def _next_start(text: str, spans: list[Span], start: int, end: int, overlap: int) -> int:
    """Start the next window `overlap` tokens back, moved forward to a word boundary."""
    first = max(end - overlap, start + 1)
    for k in range(first, end + 1):
        if k == end or _boundary(text, spans, k) >= _PUNCT:
            return k
    return first


def _fit(
    text: str, spans: list[Span], start: int, end: int, token_spans: TokenSpans, max_tokens: int
) -> int:
    """Shrink a window cut inside a word until the model's tokenization of it fits.

    A cut between words re-tokenizes to the same tokens; a cut inside one (a run of text with
    no boundary in reach) may not, so only then is the chunk tokenized again.
    """
    clean_start = start == 0 or _boundary(text, spans, start) >= _PUNCT
    while True:
        clean_end = end == len(spans) or _boundary(text, spans, end) >= _PUNCT
        if clean_start and clean_end:
            return end
        piece = text[spans[start][0] : spans[end - 1][1]]
        if len(token_spans(piece)) <= max_tokens or end - start <= 1:
            return end
        end -= 1


def _make_chunk(
    text: str, spans: list[Span], start: int, end: int, ordinal: int
) -> ChunkSpan | None:
    a, b = spans[start][0], spans[end - 1][1]
    # Tokenizers that fold leading spaces into tokens: trim by moving offsets.
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    if a == b:
        return None
    return ChunkSpan(ordinal, a, b, text[a:b], end - start)
