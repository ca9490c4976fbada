"""A search filter (rag.index.filters.Where) as a Milvus boolean expression, where it maps.

The Milvus copy of each chunk carries its document id and its document's metadata (a JSON
field), so `document_ids` and `metadata` key/value equalities become `document_id in [...]`
and `meta["key"] == value`, evaluated inside Milvus's search. What does not map safely (a key
or value with quotes, backslashes or control characters, a non-finite number) stays out of
the expression and is applied after the search, on the rows hydrated from SQL: the caller is
told which parts those are. Nothing is ever spliced into the expression unescaped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag.index.filters import MetaValue, Where

# Keys and strings that need no escaping in a Milvus string literal.
_SAFE_TEXT = re.compile(r"^[^\"'\\\x00-\x1f\x7f]{0,256}$")
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.:\- ]{1,128}$")
# Above this many ids an `id in [...]` list costs more to send and parse than it saves.
ID_LIST_MAX = 16_384


@dataclass(frozen=True)
class Expression:
    text: str  # "" when nothing could be pushed down
    document_ids_pushed: bool = False
    metadata_pushed: tuple[str, ...] = field(default_factory=tuple)
    complete: bool = True  # every part of the filter is in `text`


def literal(value: MetaValue) -> str | None:
    """`value` as a Milvus literal, or None when it does not map safely."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 2**63 else None
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str) and _SAFE_TEXT.match(value):
        return f'"{value}"'
    return None


def expression(where: Where | None) -> Expression:
    if where is None or where.empty:
        return Expression("")
    parts: list[str] = []
    complete = True
    docs_pushed = False
    if where.document_ids:
        quoted = [literal(d) for d in where.document_ids]
        if all(q is not None for q in quoted) and len(quoted) <= ID_LIST_MAX:
            parts.append(f"document_id in [{', '.join(q for q in quoted if q)}]")
            docs_pushed = True
        else:
            complete = False
    pushed: list[str] = []
    for key, value in (where.metadata or {}).items():
        lit = literal(value)
        if lit is None or not _SAFE_KEY.match(key):
            complete = False
            continue
        parts.append(f'meta["{key}"] == {lit}')
        pushed.append(key)
    return Expression(" and ".join(parts), docs_pushed, tuple(pushed), complete)


def id_list(ids: Sequence[int]) -> str:
    return f"id in [{', '.join(str(int(i)) for i in ids)}]"
