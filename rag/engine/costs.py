"""What a step costs, learnt from the steps the engine runs (plain numbers, no torch).

Two figures, as exponential moving averages of measured step times:
- a decode step's milliseconds by how many single-token rows it carries (decodes, and the
  drafts verified with them): mostly reading the weights once, plus a little per row;
- a prefill token's milliseconds (what a step takes beyond its decodes, per prompt token).

The scheduler sizes each step's prefill share from them to keep the time between two tokens of
a running answer near a target (Sarathi-Serve's stall-free batching), and speculative decoding
drafts only as many tokens as pay for their verification.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# Until measured: a 135M model on 2 CPU cores (bench/README.md), scaled by what is observed.
PRIOR_DECODE_MS = 8.0
PRIOR_ROW_MS = 2.0
PRIOR_PREFILL_TOKEN_MS = 0.7
ALPHA = 0.2  # weight of a new observation
MAX_ROWS = 64


@dataclass
class StepCosts:
    decode: dict[int, float] = field(default_factory=dict)  # rows -> ms
    prefill_token_ms: float | None = None
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

    def token_ms(self) -> float:
        return (
            self.prefill_token_ms if self.prefill_token_ms is not None else PRIOR_PREFILL_TOKEN_MS
        )

    def observe(self, rows: int, prefill_tokens: int, elapsed_ms: float) -> None:
        """Learn from a step of `rows` single-token rows and `prefill_tokens` prompt tokens."""
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
            old_t = self.prefill_token_ms
            self.prefill_token_ms = (
                per_token if old_t is None else (1 - ALPHA) * old_t + ALPHA * per_token
            )

    def prefill_budget(self, rows: int, target_ms: float, floor: int, ceiling: int) -> int:
        """Prompt tokens a step with `rows` decode rows may add and stay within `target_ms`
        (at least `floor`, so prompts always advance; at most `ceiling`)."""
        spare = target_ms - self.decode_ms(rows)
        return max(floor, min(ceiling, int(spare / self.token_ms())))
