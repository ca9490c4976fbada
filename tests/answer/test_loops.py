"""Telling that an answer repeats itself (rag.answer.loops): on words, so that line breaks,
articles, markers and tokenization do not hide a repeat, and without stopping answers whose
sentences only start alike."""

from __future__ import annotations

from rag.answer.loops import cut, repeat_start, repeated_tail


def first_repeat(text: str) -> tuple[int, int] | None:
    """The first prefix of `text` (as streamed, a character at a time) the guard stops at:
    (where the repeat starts, how much was streamed)."""
    for i in range(1, len(text) + 1):
        at = repeat_start(text[:i])
        if at is not None:
            return at, i
    return None


def test_a_sentence_coming_back_is_stopped_a_few_words_in() -> None:
    text = "The client is called WireGuard [1]. It is free. The client is called WireGuard [2]."
    found = first_repeat(text)
    assert found is not None
    at, streamed = found
    assert text[:at].rstrip() == "The client is called WireGuard [1]. It is free."
    assert text[at:streamed] == "The client is called WireGuard"  # five words into the repeat


def test_articles_and_line_breaks_do_not_hide_a_repeat() -> None:
    text = "Two is, by rule, a\n   special case for us.\n\nThree is a\n   special case for us."
    found = first_repeat(text)
    assert found is not None and text[found[0] :].startswith("special case for us")
    wrapped = (
        "It is a set of functions that can be used\nto create and manipulate collections of data "
        "in Python. It is simple.\n\nIt is a set of functions that can be used to create and\n"
        "manipulate collections of data in Python."
    )
    found = first_repeat(wrapped)
    assert found is not None and found[1] < len(wrapped) - 20
    # Eight words a third time, each time inside another sentence.
    thrice = (
        "Law is a set of rules imposed by states on one another in peace. It is often said to "
        "be rules imposed by states on one another in peace, but also custom. It is rules "
        "imposed by states on one another in peace and war."
    )
    found = first_repeat(thrice)
    assert found is not None and thrice[found[0] :].startswith("rules imposed by states")
    assert thrice.count("imposed by states on one another") == 3
    assert thrice[: found[0]].count("imposed by states on one another") == 2


def test_sentences_that_only_start_alike_go_on() -> None:
    for text in (
        "Yes. Yes. Yes. It is.",  # short sentences may come back
        "The capital of France is Paris. The capital of Germany is Berlin.",
        "The price is 10 euros a night. The price is 12 euros at weekends.",
        "1. Open the settings page.\n2. Open the network tab.\n3. Open the VPN section.",
    ):
        assert first_repeat(text) is None, text


def test_the_cut_leaves_the_repeat_out_and_says_where_it_was() -> None:
    streamed = "Channel sixteen. Channel sixteen."
    at = repeated_tail(streamed)
    assert cut(streamed, at) == ("Channel sixteen.", (17, 33))
    assert cut("Fine.", None) == ("Fine.", None)
