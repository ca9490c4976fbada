"""Opaque page cursors: a row's sort time and id, for keyset pagination (documents,
conversations)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import TypeVar

from rag.errors import Invalid

T = TypeVar("T")


def encode(t: float, row_id: str) -> str:
    return base64.urlsafe_b64encode(f"{t!r}|{row_id}".encode()).decode()


def decode(cursor: str) -> tuple[float, str]:
    """(time, id) of a cursor `encode` made; Invalid (422) for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor.encode()).decode()
        t, row_id = raw.split("|", 1)
        return float(t), row_id
    except (ValueError, UnicodeDecodeError):
        raise Invalid("cursor is not one this service issued") from None


def page(
    rows: Sequence[T], limit: int, key: Callable[[T], tuple[float, str]]
) -> tuple[list[T], str | None]:
    """The first `limit` of `rows` (fetched with limit + 1), and the cursor of the next page
    when there is one."""
    if len(rows) <= limit:
        return list(rows), None
    kept = list(rows[:limit])
    return kept, encode(*key(kept[-1]))
