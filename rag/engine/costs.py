"""What a step costs, learnt from the steps the engine runs (plain numbers, no torch).

Two figures, as exponential moving averages of measured step times:
- a decode step's milliseconds by how many single-token rows it carries (decodes, and the
  drafts verified with them): mostly reading the weights once, plus a little per row;
- a prefill token's milliseconds (what a step takes beyond its decodes, per prompt token), by
  how far into its prompt the token is: a token attends to every position before it, so one
  after 600 cached tokens costs more than one at the start. Two averages, one for tokens near
  the start and one for tokens further on, give the line between them (bench/engine_itl.py
  measures what the targets this serves cost).

The scheduler sizes each step's prefill share from them to keep the time between two tokens of
a running answer near a target (Sarathi-Serve's stall-free batching), and speculative decoding
drafts only as many tokens as pay for their verification.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# Until measured: a 135M model on 2 CPU cores (bench/engine_matmul.py's engine steps), scaled
# by what is observed.
PRIOR_DECODE_MS = 8.0
PRIOR_ROW_MS = 2.0
PRIOR_PREFILL_TOKEN_MS = 0.7
ALPHA = 0.2  # weight of a new observation
MAX_ROWS = 64
NEAR = 512  # prompt tokens before this position are "near the start" (its own average)


@dataclass
class StepCosts:
    decode: dict[int, float] = field(default_factory=dict)  # rows -> ms
    prefill_token_ms: float | None = None  # all prompt tokens
    # (mean position, ms a token) of steps whose prompt tokens sit near the start / further on
    _near: tuple[float, float] | None = None
    _far: tuple[float, float] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def decode_ms(self, rows: int) -> float:
        """Estimated milliseconds of a step of `rows` single-token rows."""
        rows = max(1, min(rows, MAX_ROWS))
        known = self.decode.get(rows)
        if known is not None:
            return known
        # The nearest measured size, grown by the prior's slope per row; else the prior.
        if self.decode:
            near = min(self.decode, key=lambda r: abs(r - rows))
            return max(0.1, self.decode[near] + PRIOR_ROW_MS * (rows - near))
        return PRIOR_DECODE_MS + PRIOR_ROW_MS * (rows - 1)

    def token_ms(self, position: float | None = None) -> float:
        """Estimated milliseconds of a prompt token at `position` (None: any)."""
        flat = (
            self.prefill_token_ms if self.prefill_token_ms is not None else PRIOR_PREFILL_TOKEN_MS
        )
        near, far = self._near, self._far
        if position is None or near is None or far is None or far[0] - near[0] < 64:
            return flat
        slope = max(0.0, (far[1] - near[1]) / (far[0] - near[0]))
        return max(1e-3, near[1] + slope * (position - near[0]))

    def observe(
        self, rows: int, prefill_tokens: int, elapsed_ms: float, position: float | None = None
    ) -> None:
        """Learn from a step of `rows` single-token rows and `prefill_tokens` prompt tokens
        (at `position` on average in their prompts, when known)."""
        with self._lock:
            if prefill_tokens == 0:
                if 0 < rows <= MAX_ROWS:
                    old = self.decode.get(rows)
                    self.decode[rows] = (
                        elapsed_ms if old is None else (1 - ALPHA) * old + ALPHA * elapsed_ms
                    )
                return
            base = self.decode_ms(rows) if rows else 0.0
            per_token = max(1e-3, (elapsed_ms - base) / prefill_tokens)
            self.prefill_token_ms = _average(self.prefill_token_ms, per_token)
            if position is not None:
                if position < NEAR:
                    self._near = _average_pair(self._near, (position, per_token))
                else:
                    self._far = _average_pair(self._far, (position, per_token))

    def prefill_budget(
        self, rows: int, target_ms: float, floor: int, ceiling: int, start: int | None = None
    ) -> int:
        """Prompt tokens a step with `rows` decode rows may add and stay within `target_ms`
        (at least `floor`, so prompts always advance; at most `ceiling`), for a chunk that
        starts at position `start` of its prompt when that is known."""
        spare = target_ms - self.decode_ms(rows)
        n = spare / self.token_ms(start)
        if start is not None:  # priced at the chunk's middle rather than its first token
            n = spare / self.token_ms(start + max(0.0, n) / 2)
        return max(floor, min(ceiling, int(n)))


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


def _average_pair(old: tuple[float, float] | None, new: tuple[float, float]) -> tuple[float, float]:
    if old is None:
        return new
    return (_average(old[0], new[0]), _average(old[1], new[1]))
