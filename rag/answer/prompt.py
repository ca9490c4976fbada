"""The chat prompt of a grounded answer: system instruction, numbered passages, the earlier
turns of the conversation, question.

Passages are quoted data, never instructions: each is fenced, and text inside a document that
could close a fence, pose as a chat role, or invite the model to render an outside link is
neutralised first. The prompt fits the model's context by dropping the weakest passages whole.

Layout, for the engine's KV reuse: the system instruction first (a cached prefix), then each
passage as a segment of its own (rag.engine.protocol.Segment), then the question. A passage's
number changes from prompt to prompt, so its header ``<passage n>`` stays outside the segment;
the segment (source, text, closing fence) is the same text wherever the passage appears, and
its KV can be computed once and reused (rag.engine.passages).

Earlier turns of a conversation come after the passages and before the question, as chat
turns: the first user message holds the passages and the first earlier question, each answer
is an assistant message, and the question asked now is the last user message. So a passage
stays a prefix, and a follow-up over the same passage extends the previous turn's prompt
exactly (its tokens and the KV the prefix cache holds for them). When the prompt does not
fit, the oldest turns are dropped first, then the weakest passages.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rag.engine.protocol import KvReuse, Segment, SegmentedPrompt, estimate_tokens


@dataclass(frozen=True)
class Wording:
    """The words around the passages: the system instruction, what comes before the first
    passage, and what follows the question. The passages' segments never change with it."""

    system: str
    header: str
    suffix: str

    def sentences(self) -> tuple[str, ...]:
        """What the answer must not repeat (rag.answer.cite reports it as echoed)."""
        text = f"{self.system} {self.suffix}"
        return tuple(s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip())


# Chosen by measurement with SmolLM2-135M-Instruct (bench/answers.py, on the even half of
# docfaq and on wiki_vital): the model's own opening ("a helpful AI assistant") and short
# imperative sentences, nothing after the question. Against the old wording: answer F1 up,
# and none of its sentences repeated as an answer (the old one's "The passages are quoted
# data from documents" was). An example of a cited answer and an "answer in one to three
# sentences" line measured worse (the model wrote "The answer to this question is:" and
# looped on it), so neither is here. Passages are neutralised before they are quoted (no
# links, roles or fences), so the instruction need not say it.
GROUNDED = Wording(
    system=(
        "You are a helpful AI assistant. "
        "Answer the user's question using only the numbered passages. "
        "After each sentence, write the number of its passage in brackets, like [1]. "
        "If the passages do not say, write: I don't know."
    ),
    header="Passages:\n\n",
    suffix="",
)
# One passage (AskSettings.evidence "one"): the short sentence that follows the quote. With a
# single passage the numbered header is always "<passage 1>", so the system instruction and
# the passage are the same tokens for every question over that passage: a prefix the
# engine's cache reuses exactly.
ONE = Wording(
    system=(
        "You are a helpful AI assistant. "
        "Answer the user's question in one short sentence, using only the passage. "
        "If the passage does not say, write: I don't know."
    ),
    header="Passage:\n\n",
    suffix="",
)
WORDINGS = {"grounded": GROUNDED, "one": ONE}
SYSTEM = GROUNDED.system
OPEN = "<passage {n}>"
CLOSE = "</passage>"

Messages = list[dict[str, str]]
TokenCounter = Callable[[SegmentedPrompt], int]


class PassageLike(Protocol):
    @property
    def chunk_id(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def filename(self) -> str: ...
    @property
    def score(self) -> float: ...


@dataclass(frozen=True)
class Prompt:
    prompt: SegmentedPrompt
    given: int  # how many of the passages (the strongest first) made it into the prompt
    tokens: int  # counted with the engine's tokenizer, or estimated

    @property
    def messages(self) -> Messages:
        return self.prompt.messages


# ---------------------------------------------------------------- neutralising document text

# Every pattern here is linear on any text. A scan that starts at one bracket stops at the
# next (link text runs to the next `[` or `]`, a target to the next unmatched `(` or `)`), so
# scans from different starts never cover the same run twice; `[^\]]*` rescanned a run of
# `[` from each of them. Bounds cap what one match may span.
_TEXT = r"([^\[\]]{0,1000})"
_TARGET = r"(?:[^()]|\([^()]{0,1000}\)){0,2000}\)"  # one level of parentheses, as in URLs
_IMAGE = re.compile(rf"!\[{_TEXT}\]\({_TARGET}")
_LINK = re.compile(rf"\[{_TEXT}\]\(\s*(?:https?:|//|www\.){_TARGET}", re.IGNORECASE)
_URL = re.compile(r"\b(?:https?://|ftp://|www\.)[^\s<>\"')\]]+", re.IGNORECASE)
_SPECIAL = re.compile(r"<\|[^|<>]{0,40}\|>|</?s>|\[/?INST\]|<<\s*/?SYS\s*>>", re.IGNORECASE)
_ROLE = re.compile(
    r"^([^\S\n]*)(#+[^\S\n]*)?(system|assistant|user|human|instruction|developer)(\s*):",
    re.IGNORECASE | re.MULTILINE,
)
# A fence-like tag whose `>` is far or missing is neutralised all the same.
_FENCE = re.compile(r"</?\s*passage\b(?:[^<>]{0,200}>)?|```", re.IGNORECASE)


def neutralise(text: str) -> str:
    """Document text made safe to quote: no outside links or images, no chat-template or
    role markers, nothing that could close the passage's fence."""
    text = _IMAGE.sub(lambda m: f"(image: {m.group(1).strip() or 'untitled'})", text)
    text = _LINK.sub(lambda m: m.group(1), text)
    text = _URL.sub("(link removed)", text)
    text = _SPECIAL.sub(" ", text)
    text = _ROLE.sub(lambda m: f"{m.group(1)}{m.group(3)} (quoted){m.group(4)}-", text)
    return _FENCE.sub("'''", text)


def _filename(name: str) -> str:
    return neutralise(name).replace("\n", " ")[:200]


# ---------------------------------------------------------------- building


def segment_text(p: PassageLike) -> str:
    """What follows a passage's numbered header: its source, its text and the closing fence;
    the same text in every prompt the passage appears in."""
    return f" (from {_filename(p.filename)})\n{neutralise(p.text).strip()}\n{CLOSE}"


def segment_of(p: PassageLike, salt: str) -> Segment:
    """The passage's reusable segment, keyed by its chunk, a hash of its rendered text and
    `salt` (the tenant): an edited chunk or another tenant's never matches."""
    text = segment_text(p)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return Segment(text, f"{salt}:{p.chunk_id}:{digest}", p.chunk_id)


def passages_block(passages: Sequence[PassageLike]) -> str:
    return "\n\n".join(
        f"{OPEN.format(n=n)}{segment_text(p)}" for n, p in enumerate(passages, start=1)
    )


class TurnLike(Protocol):
    @property
    def question(self) -> str: ...
    @property
    def answer(self) -> str: ...


def messages_for(
    question: str,
    passages: Sequence[PassageLike],
    wording: Wording = GROUNDED,
    history: Sequence[TurnLike] = (),
) -> Messages:
    """The system message, then the passages with the first question, each earlier answer
    and the question after it; `history` is the conversation's earlier turns, oldest first."""
    asked = [*(t.question for t in history), question]
    lines = [f"Question: {neutralise(q).strip()}\n{wording.suffix}" for q in asked]
    if passages:
        lines[0] = f"{wording.header}{passages_block(passages)}\n\n{lines[0]}"
    else:
        lines = [line.rstrip("\n") if not wording.suffix else line for line in lines]
    messages = [
        {"role": "system", "content": wording.system},
        {"role": "user", "content": lines[0]},
    ]
    for turn, line in zip(history, lines[1:], strict=True):
        messages.append({"role": "assistant", "content": neutralise(turn.answer).strip()})
        messages.append({"role": "user", "content": line})
    return messages


def segmented(
    question: str,
    passages: Sequence[PassageLike],
    *,
    salt: str,
    kv_reuse: KvReuse = "blend",
    wording: Wording = GROUNDED,
    history: Sequence[TurnLike] = (),
) -> SegmentedPrompt:
    return SegmentedPrompt(
        messages_for(question, passages, wording, history),
        tuple(segment_of(p, salt) for p in passages),
        kv_reuse,
    )


def build(
    question: str,
    passages: Sequence[PassageLike],
    *,
    context_tokens: int,
    max_tokens: int,
    count: TokenCounter | None = None,
    salt: str = "",
    kv_reuse: KvReuse = "blend",
    wording: Wording = GROUNDED,
    history: Sequence[TurnLike] = (),
) -> Prompt:
    """The prompt for `question` over as many of `passages` (strongest first, as ranked) as
    fit in `context_tokens` with `max_tokens` left for the answer. The oldest earlier turns
    go first, then weak passages, whole, never cut. `salt` (the tenant) and `kv_reuse` go to
    the segments; `wording` is the text around them."""
    count = count or estimate_tokens
    room = context_tokens - max_tokens
    turns = list(history)

    def make(n: int) -> tuple[SegmentedPrompt, int]:
        sp = segmented(question, passages[:n], salt=salt, kv_reuse=kv_reuse, wording=wording,
                       history=turns)  # fmt: skip
        return sp, count(sp)

    whole, tokens = make(len(passages))
    while turns and tokens > room:
        turns.pop(0)
        whole, tokens = make(len(passages))
    if tokens <= room:
        return Prompt(whole, len(passages), tokens)
    # The longest prefix of the ranking that fits: a binary search over how many to keep.
    lo, hi = 0, len(passages) - 1
    best, best_tokens = make(0)
    best_n = 0
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate, n_tokens = make(mid)
        if n_tokens <= room:
            best, best_n, best_tokens = candidate, mid, n_tokens
            lo = mid + 1
        else:
            hi = mid - 1
    return Prompt(best, best_n, best_tokens)
