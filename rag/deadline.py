"""A request's deadline, passed down every stage (time.monotonic based)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Deadline:
    at: float  # time.monotonic() value; inf for "no budget"
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def after_ms(cls, budget_ms: float | None) -> Deadline:
        now = time.monotonic()
        if budget_ms is None:
            return cls(float("inf"), now)
        return cls(now + budget_ms / 1000.0, now)

    @property
    def bounded(self) -> bool:
        return self.at != float("inf")

    def remaining_ms(self) -> float:
        return (self.at - time.monotonic()) * 1000.0

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000.0
