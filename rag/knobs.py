"""The knobs of a search: one shape for what a request asks, what a collection stores as its
defaults, and what a search actually used.

`None` means "not set here": a request's knobs are laid over the collection's saved defaults,
and those over the service's (`Knobs.over`). Indexes read `k`, `ef_search`, `nprobe` and
`exact` of knobs already resolved that way; `hybrid` and `budget_ms` belong to the retriever.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from rag.errors import Invalid

# The largest k a single search may ask for; the API documents the same bound.
MAX_K = 1000
# k where nothing set one (an index searched directly).
DEFAULT_K = 10


@dataclass(frozen=True, slots=True)
class Knobs:
    k: int | None = None  # passages to return
    ef_search: int | None = None  # HNSW: candidate list size, at least k
    nprobe: int | None = None  # IVF: inverted lists scanned
    exact: bool | None = None  # brute force over every live vector, whatever the kind
    hybrid: float | None = None  # keyword weight in the fusion, 0 = dense only
    budget_ms: float | None = None  # latency budget of the whole search

    def __post_init__(self) -> None:
        if self.k is not None and not 1 <= self.k <= MAX_K:
            raise Invalid(f"k must be between 1 and {MAX_K}, got {self.k}")
        if self.ef_search is not None and self.ef_search < 1:
            raise Invalid(f"ef_search must be positive, got {self.ef_search}")
        if self.nprobe is not None and self.nprobe < 1:
            raise Invalid(f"nprobe must be positive, got {self.nprobe}")
        if self.hybrid is not None and not 0.0 <= self.hybrid <= 1.0:
            raise Invalid("hybrid is the keyword weight, between 0 and 1")
        if self.budget_ms is not None and not self.budget_ms > 0:
            raise Invalid(f"budget_ms must be positive, got {self.budget_ms}")

    @property
    def top_k(self) -> int:
        return self.k if self.k is not None else DEFAULT_K

    def over(self, base: Knobs) -> Knobs:
        """These knobs where set, `base`'s elsewhere."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(base, **{name: v for name, v in values.items() if v is not None})

    def with_(self, **changes: Any) -> Knobs:
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, saved: dict[str, Any] | None) -> Knobs:
        """Knobs stored as JSON (a collection's defaults); unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (saved or {}).items() if k in names and v is not None})

    def as_dict(self, *, drop_unset: bool = True) -> dict[str, Any]:
        out = asdict(self)
        return {k: v for k, v in out.items() if v is not None} if drop_unset else out
