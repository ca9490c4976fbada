"""Follow-ups made stand-alone (rag.answer.history), the bounds on a history, and the prompt's
layout for a conversation: earlier turns after the passage and before the question, so that a
follow-up over the same passage extends the previous turn's prompt and its KV is reused."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest

from rag.answer import history as h
from rag.answer import prompt as prompts
from rag.answer.history import Turn, resolve
from rag.engine import SamplingParams
from rag.errors import TooLarge

DUNE = Turn("Who wrote the novel Dune?", "Dune was written by Frank Herbert. [1]")
HOTEL = Turn("How much can I spend on a hotel in Munich?", "€160 a night [1].")


@pytest.mark.parametrize(
    ("question", "history", "expected", "how"),
    [
        ("Which award did it win in 1966?", [DUNE], "Which award did Dune win in 1966?",
         "reference"),
        ("When was he born?", [DUNE], "When was Frank Herbert born?", "reference"),
        ("And in London?", [HOTEL], "How much can I spend on a hotel in London?", "ellipsis"),
        ("What about Berlin?", [HOTEL], "How much can I spend on a hotel in Berlin?",
         "ellipsis"),
        ("Stockholm?", [HOTEL], "How much can I spend on a hotel in Stockholm?", "ellipsis"),
        ("And who published it?", [DUNE], "Who published Dune?", "reference"),
        ("How many people live there?", [Turn("Where was Frida Kahlo born?", "Coyoacán.")],
         "How many people live in Coyoacán?", "reference"),
        # A continued question naming nothing is about what the previous one named.
        ("And who wrote the screenplay?", [Turn("Whose novel was Psycho based on?")],
         "Who wrote the screenplay of Psycho?", "ellipsis"),
        # "to" before a name is a preposition, not "is it possible to".
        ("When was it donated to MoMA?", [Turn("Who painted The Persistence of Memory?")],
         "When was The Persistence of Memory donated to MoMA?", "reference"),
        # A "who" question names in lower case what it asks about; "he" is who answered.
        ("What did he name it after?",
         [Turn("Who discovered osmium?", "Smithson Tennant discovered it. [1]")],
         "What did Smithson Tennant name osmium after?", "reference"),
        ("When was he born?", [Turn("Who invented the telephone?", "Alexander Graham Bell.")],
         "When was Alexander Graham Bell born?", "reference"),
        # A third turn resolves through the second one's resolved question.
        ("Did it sell well?", [DUNE, Turn("When was it published?", "In 1965.")],
         "Did Dune sell well?", "reference"),
    ],
)  # fmt: skip
def test_follow_ups_are_made_stand_alone(
    question: str, history: list[Turn], expected: str, how: str
) -> None:
    r = resolve(question, history)
    assert (r.query, r.how) == (expected, how)
    assert r.rewritten


@pytest.mark.parametrize(
    "question",
    [
        "Who published the complete Ulysses in Paris in 1922?",
        "What pseudonym did Emily Brontë use for Wuthering Heights?",
        "How many days of annual leave do new employees get?",
        "What is Dune?",
        "When did the Berlin Wall fall, and who ordered it opened?",
        "Is it possible to carry over unused leave to the next year?",
        "How long does it take to get reimbursed for travel?",
        "Is it allowed to bring the dog to the office?",
        "Are there any fees for paying late?",
    ],
)
def test_a_question_that_stands_alone_is_searched_as_asked(question: str) -> None:
    for history in ([], [DUNE], [HOTEL, DUNE]):
        r = resolve(question, history)
        assert r.query == question and not r.rewritten


def test_rewriting_can_be_turned_off_and_stored_queries_are_used() -> None:
    assert resolve("When was it published?", [DUNE], rewrite=False) == h.Resolved(
        "When was it published?", "off"
    )
    stored = Turn("When was it published?", "1965", searched="When was Dune first published?")
    assert h.searched_queries([DUNE, stored])[-1] == "When was Dune first published?"


def test_a_history_past_its_bounds_is_too_large() -> None:
    turns = [Turn("q?", "a")] * 3
    h.check_bounds(turns, 3, 100)
    with pytest.raises(TooLarge) as e:
        h.check_bounds(turns, 2, 100)
    assert e.value.detail == {"limit": "history_turns", "max": 2, "got": 3}
    with pytest.raises(TooLarge):
        h.check_bounds([Turn("x" * 60, "y" * 50)], 3, 100)


@pytest.mark.parametrize("run", ["it " * 20_000, "And " * 20_000, "A " * 40_000 + "?"])
def test_resolving_is_linear_on_hostile_text(run: str) -> None:
    t = time.perf_counter()
    r = resolve(run[:4000], [Turn("What is " + "Big " * 900 + "Name?", "x")])
    assert time.perf_counter() - t < 1.0
    assert len(r.query) <= h.MAX_CHARS


def test_prompt_turns_are_the_latest_within_bounds_without_markers() -> None:
    turns = [Turn(f"Question {i}?", f"Answer {i} [1].") for i in range(5)]
    kept = h.prompt_turns(turns, 2, 1000)
    assert [t.question for t in kept] == ["Question 3?", "Question 4?"]
    assert kept[-1].answer == "Answer 4 ."
    assert h.prompt_turns(turns, 5, 30) == [Turn("Question 4?", "Answer 4 .")]
    assert h.prompt_turns(turns, 0, 1000) == []


# ---------------------------------------------------------------- the prompt's layout


@dataclass(frozen=True)
class P:
    chunk_id: int
    text: str
    filename: str = "dune.txt"
    score: float = 1.0


PASSAGE = P(7, "Dune is a 1965 novel by Frank Herbert. It won the Hugo Award in 1966.")


def test_earlier_turns_come_after_the_passage_and_before_the_question() -> None:
    first = prompts.messages_for("Who wrote Dune?", [PASSAGE], prompts.ONE)
    second = prompts.messages_for(
        "When was Dune published?", [PASSAGE], prompts.ONE, [Turn("Who wrote Dune?", "Herbert.")]
    )
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    # The first turn's messages are the second's first ones: the same passage, first.
    assert second[:2] == first
    assert second[2] == {"role": "assistant", "content": "Herbert."}
    assert second[3]["content"].startswith("Question: When was Dune published?")
    assert "<passage 1>" in second[1]["content"] and "<passage" not in second[3]["content"]


def test_a_prompt_too_long_drops_the_oldest_turns_before_any_passage() -> None:
    turns = [Turn(f"Earlier question {i}?", "An answer " * 40) for i in range(4)]
    full = prompts.build("Now?", [PASSAGE], context_tokens=100_000, max_tokens=10, history=turns)
    room = full.tokens - 150
    built = prompts.build("Now?", [PASSAGE], context_tokens=room + 10, max_tokens=10,
                          history=turns)  # fmt: skip
    assert built.given == 1
    text = " ".join(m["content"] for m in built.messages)
    assert "Earlier question 0?" not in text and "Earlier question 3?" in text


@pytest.mark.slow
def test_a_follow_up_over_the_same_passage_reuses_the_previous_turns_kv(
    smollm_engine: Any,
) -> None:
    """With the real tokenizer and engine: the second turn's prompt starts with the first
    turn's tokens, and the prefix cache serves them."""
    engine = smollm_engine
    salt = f"t-{time.monotonic_ns()}"
    first = prompts.build("Who wrote Dune?", [PASSAGE], context_tokens=2048, max_tokens=16,
                          salt=salt, kv_reuse="prefix", wording=prompts.ONE)  # fmt: skip
    turn = Turn("Who wrote Dune?", "Dune is a 1965 novel by Frank Herbert.")
    second = prompts.build("When was Dune published?", [PASSAGE], context_tokens=2048,
                           max_tokens=16, salt=salt, kv_reuse="prefix", wording=prompts.ONE,
                           history=[turn])  # fmt: skip
    tok = engine.tokenizer
    ids1, _ = tok.encode_segments(first.prompt)
    ids2, _ = tok.encode_segments(second.prompt)
    assert ids2[: len(ids1)] == ids1

    async def run(prompt: Any) -> Any:
        params = SamplingParams(max_tokens=4, temperature=0.0)
        usage = None
        async for ev in engine.submit(prompt, params, cache_salt=salt):
            if ev.finished:
                usage = ev.usage
        return usage

    asyncio.run(run(first.prompt))
    usage = asyncio.run(run(second.prompt))
    block = engine.block_manager.block_size
    assert usage.cached_prompt_tokens >= len(ids1) // block * block > 0
