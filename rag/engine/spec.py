"""Speculative decoding by prompt lookup: drafts taken from the sequence's own tokens.

A grounded answer quotes its passages, so the tokens that follow the last few generated ones
have often appeared before, in a passage or earlier in the answer. The proposer finds the most
recent earlier occurrence of the sequence's last n tokens (n from `max_ngram` down to
`min_ngram`) and drafts the k tokens that followed it; one forward pass then scores the last
token and the k drafts together, and the longest agreeing prefix is kept (rag.engine.sampler
decides agreement). No draft model, no extra weights.

How many to draft is a bet: a step of more rows costs more (rag.engine.costs learns by how
much), and each draft is accepted with the sequence's measured acceptance rate. `choose_k`
drafts the k that maximises expected tokens per millisecond for the whole step, which is 0 for
a sequence whose drafts keep failing, and shrinks as the batch grows (a step's weights are
read once for all its rows, so rows are cheap at batch 1 and not at batch 16). A sequence whose
drafts all fail rests a few steps; above `max_batch` running sequences no one drafts.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecConfig:
    k_max: int = 4  # draft tokens per step, at most
    min_ngram: int = 2
    max_ngram: int = 4
    # Above this many running sequences no one drafts (choose_k would draft little anyway).
    max_batch: int = 8
    # Steps a sequence waits before drafting again after its drafts kept being rejected.
    backoff_steps: int = 8


@dataclass
class SpecState:
    """One sequence's drafting: its current k, how its drafts have fared, and an index of
    where each of its n-grams last ended (built once over the prompt, then one entry per n a
    new token), so a proposal costs a dictionary lookup, not a scan."""

    proposed: int = 0
    accepted: int = 0
    pause: int = 0  # steps left before drafting again
    alpha: float = 0.6  # estimated chance that a draft token is accepted
    _last_end: dict[tuple[int, ...], int] | None = None
    _indexed_to: int = 0  # n-grams ending at positions < this are indexed

    def update(self, config: SpecConfig, drafted: int, accepted: int) -> None:
        self.proposed += drafted
        self.accepted += accepted
        if drafted == 0:
            return
        # Drafts are accepted in order: `accepted` successes, then one failure if short.
        trials = accepted + (1 if accepted < drafted else 0)
        rate = accepted / trials
        weight = min(1.0, 0.3 * trials)
        self.alpha = (1 - weight) * self.alpha + weight * rate
        if accepted == 0:
            self.pause = config.backoff_steps

    def expected_tokens(self, k: int) -> float:
        """Tokens a step yields with k drafts: the next one, plus each draft accepted in turn."""
        a = self.alpha
        return sum(a**i for i in range(k + 1))

    def propose(self, token_ids: Seq[int], k: int, config: SpecConfig) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the sequence's
        last n tokens (the longest n from max_ngram down that occurs), or []."""
        if k <= 0:
            return []
        n_tokens = len(token_ids)
        index = self._last_end if self._last_end is not None else {}
        self._last_end = index
        # Index the n-grams that end before the last position (the tail is what we look up).
        for end in range(max(self._indexed_to, 1), n_tokens):
            for n in range(config.min_ngram, config.max_ngram + 1):
                if end >= n:
                    index[tuple(token_ids[end - n : end])] = end
        self._indexed_to = max(self._indexed_to, n_tokens)
        for n in range(config.max_ngram, config.min_ngram - 1, -1):
            if n_tokens <= n:
                continue
            found = index.get(tuple(token_ids[n_tokens - n :]))
            if found is not None and found < n_tokens:
                follow = list(token_ids[found : found + k])
                if follow:
                    return follow
        return []


def choose_k(
    state: SpecState, k_cap: int, rows: int, tokens: float, cost_ms: Callable[[int], float]
) -> int:
    """The draft count for one sequence that maximises the step's expected tokens per
    millisecond, given the step's `rows` and expected `tokens` so far (this sequence's own
    decode row counted in both) and `cost_ms(rows)` of a step."""
    best_k, best = 0, tokens / cost_ms(rows)
    for k in range(1, k_cap + 1):
        rate = (tokens - 1 + state.expected_tokens(k)) / cost_ms(rows + k)
        if rate > best * 1.02:  # a margin: verification also costs what the model misses
            best_k, best = k, rate
    return best_k


def propose(token_ids: Seq[int], k: int, config: SpecConfig) -> list[int]:
    """A one-off proposal (no index kept): see SpecState.propose."""
    return SpecState().propose(token_ids, k, config)
