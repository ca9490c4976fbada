"""What a request's logits go through before a token is chosen: penalties over the tokens it
has generated, and the citation mask.

Penalties count generated tokens only (as OpenAI defines frequency and presence penalties),
so an answer that quotes its passages is not punished for it:

- frequency_penalty: each generated occurrence of a token lowers its logit by this much;
- presence_penalty: a token generated at least once is lowered by this much;
- repetition_penalty: transformers' rule (a generated token's logit divided by it when
  positive, multiplied when negative), over generated tokens too.

The citation mask (`cite_passages` = n): once the answer opens a marker ("[" after a space,
a line start or punctuation, not an index like ``x[0]``), only what keeps it a valid marker may
follow: numbers 1..n, commas and spaces, then "]". A marker the model writes therefore always
points to a passage it was given. With `cite_choice` too (the answer path's judgement of which
passages support a sentence, rag.answer.cite.chooser), the marker may name only the passages
that best support the sentence it closes: the model says where a citation goes, the evidence
says which passage it names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

from rag.engine.sequence import SamplingParams

# Characters a token inside a marker may hold before its "]".
_INSIDE = re.compile(r"^[\d ,]*(\].*)?$", re.DOTALL)
_DONE = re.compile(r"^ *[1-9]\d{0,3}( *, *[1-9]\d{0,3})* *$")
_PARTIAL = re.compile(r"^ *([1-9]\d{0,3} *, *)*(\d{0,4})$")
_TAIL_TOKENS = 12  # generated tokens looked at to tell whether a marker is open
_SENTENCE_TOKENS = 96  # generated tokens looked at for the sentence a marker closes
_MAX_MARKER = 24  # characters of marker content, at most
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+|\n")


def marker_open(text: str) -> str | None:
    """The content of a citation marker `text` ends inside (after its "["), or None."""
    at = text.rfind("[")
    if at < 0 or "]" in text[at:]:
        return None
    if at > 0 and (text[at - 1].isalnum() or text[at - 1] in "_)]"):
        return None  # an index or a link, not a marker
    return text[at + 1 :]


def sentence_before(text: str) -> str:
    """The sentence a marker opened at the end of `text` closes: the text before its "[",
    back to the previous sentence's end."""
    head = text[: text.rfind("[")]
    ends = list(_SENTENCE_END.finditer(head.rstrip()))
    return head[ends[-1].end() :] if ends else head


def fits(content: str, piece: str, n: int, only: frozenset[int] | None = None) -> bool:
    """Whether `piece` may follow marker content `content` with passages 1..n (or only
    the numbers in `only`), each named once."""
    allowed = frozenset(range(1, n + 1)) if only is None else only
    s = content + piece
    close = s.find("]")
    head = s if close < 0 else s[:close]
    if len(head) > _MAX_MARKER:
        return False
    if close >= 0:
        if not _DONE.match(head):
            return False
        named = [int(x) for x in head.replace(" ", "").split(",")]
        return len(set(named)) == len(named) and all(x in allowed for x in named)
    m = _PARTIAL.match(head)
    if m is None:
        return False
    numbers = [x for x in head.replace(" ", "").split(",") if x]
    done, last = (numbers[:-1], numbers[-1]) if numbers and not head.endswith(",") else (
        numbers, ""
    )  # fmt: skip
    if any(int(x) not in allowed for x in done) or len(set(done)) < len(done):
        return False
    if last.startswith("0"):
        return False
    # A number still being written must be the start of some allowed number not yet named.
    left = allowed - {int(x) for x in done}
    return bool(left) if not last else any(str(k).startswith(last) for k in left)


class CitationMask:
    """The tokens allowed inside an open marker, from the vocabulary's texts (built on first
    use: decoding every token of the vocabulary takes a while)."""

    def __init__(self, token_texts: Callable[[], Sequence[str]]) -> None:
        self._load = token_texts
        self._texts: Sequence[str] | None = None
        self._candidates: list[tuple[int, str]] = []
        self._allowed: dict[tuple[str, int, frozenset[int] | None], torch.Tensor] = {}

    @property
    def texts(self) -> Sequence[str]:
        if self._texts is None:
            self._texts = self._load()
            self._candidates = [(i, t) for i, t in enumerate(self._texts) if t and _INSIDE.match(t)]
        return self._texts

    def allowed(
        self,
        generated: Sequence[int],
        n: int,
        device: torch.device,
        choose: Callable[[str], tuple[int, ...]] | None = None,
    ) -> torch.Tensor | None:
        """Token ids the next token must be one of, or None when no marker is open.
        `choose`: the passages that may be named for a sentence (empty: any of 1..n)."""
        texts = self.texts
        tail = "".join(texts[t] for t in generated[-_TAIL_TOKENS:] if t < len(texts))
        content = marker_open(tail)
        if content is None:
            return None
        only = None
        if choose is not None:
            text = "".join(texts[t] for t in generated[-_SENTENCE_TOKENS:] if t < len(texts))
            picked_numbers = frozenset(k for k in choose(sentence_before(text)) if 1 <= k <= n)
            only = picked_numbers or None
        key = (content, n, only)
        ids = self._allowed.get(key)
        if ids is None:
            picked = [i for i, t in self._candidates if fits(content, t, n, only)]
            if not picked:  # cannot happen with a real vocabulary; never block everything
                return None
            ids = torch.tensor(picked, dtype=torch.long, device=device)
            if len(self._allowed) > 4096:
                self._allowed.clear()
            self._allowed[key] = ids
        return ids


class LogitRules:
    """Applies a request's penalties and mask to its logits rows, in place."""

    def __init__(self, token_texts: Callable[[], Sequence[str]] | None = None) -> None:
        self.mask = CitationMask(token_texts) if token_texts is not None else None

    def apply(self, logits: torch.Tensor, params: SamplingParams, generated: Sequence[int]) -> None:
        """`logits` [V], the row after `generated` (this request's output so far)."""
        if generated and (params.frequency_penalty or params.presence_penalty):
            ids = torch.tensor(generated, dtype=torch.long, device=logits.device)
            counts = torch.bincount(ids, minlength=logits.shape[-1])[: logits.shape[-1]]
            counts = counts.to(logits.dtype)
            logits -= counts * params.frequency_penalty
            logits -= (counts > 0).to(logits.dtype) * params.presence_penalty
        if generated and params.repetition_penalty != 1.0:
            ids = torch.tensor(sorted(set(generated)), dtype=torch.long, device=logits.device)
            picked = logits[ids]
            p = params.repetition_penalty
            logits[ids] = torch.where(picked > 0, picked / p, picked * p)
        if params.cite_passages and self.mask is not None:
            allowed = self.mask.allowed(
                generated, params.cite_passages, logits.device, params.cite_choice
            )
            if allowed is not None:
                keep = logits[allowed]
                logits.fill_(float("-inf"))
                logits[allowed] = keep
