"""Token-aware chunking: limits, overlap, boundaries and offsets, with fake and real tokenizers."""

from __future__ import annotations

import random
import time

import pytest

from ingest.chunk import ChunkSpan, TokenSpans, chunk_text
from rag.embed import HashEmbedder, SentenceTransformerEmbedder
from rag.embed.sentence import PIECE_CHARS

HASH = HashEmbedder()
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
]


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(device="cpu")


def random_text(rng: random.Random, n_words: int) -> str:
    out: list[str] = []
    for _ in range(n_words):
        out.append(rng.choice(WORDS))
        roll = rng.random()
        if roll < 0.05:
            out.append(".\n\n")
        elif roll < 0.12:
            out.append(". ")
        elif roll < 0.15:
            out.append(",\n")
        elif roll < 0.17:
            out.append("-")
        else:
            out.append(" ")
    return "".join(out)


def check_invariants(
    text: str, chunks: list[ChunkSpan], spans_fn: TokenSpans, max_tokens: int
) -> None:
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert chunk.text == chunk.text.strip()
        assert 0 < chunk.token_count <= max_tokens
        assert len(spans_fn(chunk.text)) <= max_tokens
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.start_char < after.start_char
        assert before.end_char < after.end_char
    # Every token lands in some chunk.
    covered = [(c.start_char, c.end_char) for c in chunks]
    for a, b in spans_fn(text):
        assert any(s <= a and b <= e for s, e in covered), (a, b)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(16, 0), (16, 4), (50, 10), (200, 32)])
def test_invariants_on_random_texts(max_tokens: int, overlap: int) -> None:
    rng = random.Random(max_tokens * 1000 + overlap)
    for _ in range(25):
        text = random_text(rng, rng.randint(0, 800))
        chunks = chunk_text(text, HASH.token_spans, max_tokens, overlap)
        check_invariants(text, chunks, HASH.token_spans, max_tokens)


def test_overlap_between_consecutive_chunks() -> None:
    text = " ".join(f"w{i}" for i in range(1000))  # no sentence or paragraph breaks
    chunks = chunk_text(text, HASH.token_spans, 100, 20)
    for before, after in zip(chunks, chunks[1:], strict=False):
        shared = before.text[after.start_char - before.start_char :]
        assert len(HASH.token_spans(shared)) == 20
    assert all(c.token_count == 100 for c in chunks[:-1])


def test_no_overlap() -> None:
    text = " ".join(f"w{i}" for i in range(1000))
    chunks = chunk_text(text, HASH.token_spans, 100, 0)
    assert len(chunks) == 10
    assert all(
        after.start_char > before.end_char
        for before, after in zip(chunks, chunks[1:], strict=False)
    )


def test_prefers_paragraph_then_sentence_boundaries() -> None:
    paragraph = " ".join(["word"] * 29) + "."  # 30 tokens
    text = "\n\n".join([paragraph] * 10)
    chunks = chunk_text(text, HASH.token_spans, 100, 0)
    assert all(c.text.endswith(".") for c in chunks)
    assert all(text[c.end_char : c.end_char + 2] in ("\n\n", "") for c in chunks)
    sentences = " ".join(["Short sentence here."] * 60)  # 4 tokens each
    chunks = chunk_text(sentences, HASH.token_spans, 50, 0)
    assert all(c.text.endswith(".") for c in chunks)


def test_empty_and_whitespace_only() -> None:
    assert chunk_text("", HASH.token_spans, 50, 5) == []
    assert chunk_text(" \n\n\t  \n", HASH.token_spans, 50, 5) == []


def test_short_text_is_one_chunk_with_trimmed_offsets() -> None:
    text = "\n\n   Hello there, world.  \n"
    (chunk,) = chunk_text(text, HASH.token_spans, 50, 5)
    assert chunk.text == "Hello there, world."
    assert (chunk.start_char, chunk.end_char) == (5, 24)


def test_deterministic() -> None:
    text = random_text(random.Random(3), 3000)
    assert chunk_text(text, HASH.token_spans, 64, 8) == chunk_text(text, HASH.token_spans, 64, 8)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (10, 10), (10, -1), (10, 11)])
def test_rejects_bad_settings(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("some text", HASH.token_spans, max_tokens, overlap)


def test_tokenizes_once_and_is_fast_on_5mb() -> None:
    text = random_text(random.Random(5), 950_000)
    assert len(text) > 5_000_000
    calls = []

    def counting_spans(piece: str) -> list[tuple[int, int]]:
        calls.append(len(piece))
        return HASH.token_spans(piece)

    started = time.monotonic()
    chunks = chunk_text(text, counting_spans, 200, 32)
    elapsed = time.monotonic() - started
    assert calls == [len(text)]
    assert len(chunks) > 5000
    assert elapsed < 30, elapsed


# --- the real tokenizer ----------------------------------------------------------------------

REAL_TEXT = (
    "Retrieval-augmented generation (RAG) grounds answers in documents. "
    "It was introduced in 2020; since then, it's everywhere!\n\n"
    "Caf\u00e9 na\u00efve co\u00f6perate \u2014 \u201cquoted\u201d text, "
    "URLs like https://example.com/a/b?c=d&e=f#frag and emails a.b@example.org.\n"
    "\u4e2d\u6587\u6587\u672c\u6ca1\u6709\u7a7a\u683c\u3002\u65e5\u672c\u8a9e\u3082\u3002 "
    "Numbers: 3.14159, 1,000,000, v2.0.1. Emoji \U0001f600 and symbols \u00a9\u00ae\u2122.\n\n"
    + "supercalifragilisticexpialidocious" * 40
    + "\n\n"
)


def test_real_tokenizer_never_overflows(minilm: SentenceTransformerEmbedder) -> None:
    text = REAL_TEXT * 30
    for max_tokens, overlap in [(32, 4), (128, 16), (minilm.max_tokens, 32)]:
        chunks = chunk_text(text, minilm.token_spans, max_tokens, overlap)
        check_invariants(text, chunks, minilm.token_spans, max_tokens)


def test_real_tokenizer_chunks_fit_the_model(minilm: SentenceTransformerEmbedder) -> None:
    text = random_text(random.Random(11), 5000) + REAL_TEXT
    chunks = chunk_text(text, minilm.token_spans, minilm.max_tokens, 32)
    tokenizer = minilm._tokenizer
    model_limit = minilm._model.max_seq_length
    for chunk in chunks:
        ids = tokenizer(chunk.text, add_special_tokens=True)["input_ids"]
        assert len(ids) <= model_limit


def test_real_tokenizer_long_word_without_spaces(minilm: SentenceTransformerEmbedder) -> None:
    # No boundary in reach: the chunker cuts inside the run and re-checks the count.
    text = "\u00e9abc" * 3000
    chunks = chunk_text(text, minilm.token_spans, 64, 8)
    check_invariants(text, chunks, minilm.token_spans, 64)


@pytest.mark.slow
def test_real_tokenizer_on_5mb_is_fast(minilm: SentenceTransformerEmbedder) -> None:
    text = (REAL_TEXT + random_text(random.Random(13), 2000)) * 400
    assert len(text) > 5_000_000
    started = time.monotonic()
    chunks = chunk_text(text, minilm.token_spans, minilm.max_tokens, 32)
    elapsed = time.monotonic() - started
    assert len(chunks) > 1000
    assert elapsed < 60, elapsed


def _word_spans(text: str) -> list[tuple[int, int]]:
    """A tokenizer that, like WordPiece past 100 characters, makes one token of any word."""
    import re

    return [m.span() for m in re.finditer(r"\S+", text)]


@pytest.mark.parametrize("overlap", [0, 8, 31])
def test_chunks_are_bounded_in_characters_too(overlap: int) -> None:
    # A 300,000-character word is one token ([UNK]): bounded in tokens alone it was one chunk.
    text = "a few words first. " * 5 + "x" * 300_000 + " and some words after it." * 20
    chunks = chunk_text(text, _word_spans, 64, overlap, max_chars=2_000)
    assert chunks
    assert max(len(c.text) for c in chunks) <= 2_000
    for chunk in chunks:
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert 0 < chunk.token_count <= 64
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.start_char < after.start_char and before.end_char < after.end_char
    # Everything is covered, and overlap does not multiply the stored text.
    covered = sorted((c.start_char, c.end_char) for c in chunks)
    reach = 0
    for a, b in covered:
        assert a <= reach or not text[reach:a].strip()
        reach = max(reach, b)
    assert not text[reach:].strip()
    assert sum(len(c.text) for c in chunks) <= 3 * len(text)


def test_character_bound_leaves_ordinary_text_alone() -> None:
    text = random_text(random.Random(5), 3000)
    assert chunk_text(text, HASH.token_spans, 50, 10, max_chars=50 * 16) == chunk_text(
        text, HASH.token_spans, 50, 10
    )


def test_real_tokenizer_one_token_word_is_cut_by_characters(
    minilm: SentenceTransformerEmbedder,
) -> None:
    text = "Before. " + "y" * 300_000 + " after."
    # one [UNK] per piece the tokenizer reads at a time: tokens far longer than max_chars
    assert len(minilm.token_spans(text)) <= 5 + len(text) // PIECE_CHARS
    chunks = chunk_text(text, minilm.token_spans, minilm.max_tokens, 32, max_chars=2_560)
    assert max(len(c.text) for c in chunks) <= 2_560
    assert chunks[0].text.startswith("Before.") and chunks[-1].text.endswith("after.")
    for chunk in chunks:
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert len(minilm.token_spans(chunk.text)) <= minilm.max_tokens
