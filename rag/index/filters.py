"""What a search may restrict itself to, and what that means for one row.

A `Where` names document ids and metadata key/value equalities. An index that declares
`filters_inside` (Milvus) takes it in `search` and evaluates as much of it as its engine can
express; every other index ignores it, and the retriever resolves the filter to chunk ids in
SQL (`allowed`) instead. Either way the retriever checks the hydrated rows with `matches`, so a
part an engine could not express is still applied, with the meaning SQL gives it
(rag.db.chunks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MetaValue = str | int | float | bool


@dataclass(frozen=True)
class Where:
    """What a search asks to restrict itself to (None/empty: no restriction)."""

    document_ids: tuple[str, ...] | None = None
    metadata: Mapping[str, MetaValue] | None = None

    @property
    def empty(self) -> bool:
        return not self.document_ids and not self.metadata


def matches(where: Where, document_id: str, meta: Mapping[str, object] | None) -> bool:
    """The filter applied to one hydrated row, with SQL's meaning of equality (a boolean is
    not a number; 3 equals 3.0)."""
    if where.document_ids and document_id not in where.document_ids:
        return False
    meta = meta or {}
    for key, want in (where.metadata or {}).items():
        have = meta.get(key)
        if isinstance(want, bool) or isinstance(have, bool):
            if have is not want:
                return False
        elif isinstance(want, int | float):
            if not isinstance(have, int | float) or float(have) != float(want):
                return False
        elif have != want:
            return False
    return True
