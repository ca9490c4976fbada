"""Page cursors (rag.db.cursors): a row's exact sort key round trips, anything else is
Invalid, and a page says whether another follows."""

from __future__ import annotations

import pytest

from rag.db import cursors
from rag.errors import Invalid


def test_a_cursor_carries_its_rows_exact_time_and_id() -> None:
    t = 1_712_345_678.123_456_7
    assert cursors.decode(cursors.encode(t, "abc|def")) == (t, "abc|def")


@pytest.mark.parametrize("bad", ["", "not base64!", "bm90IGEgY3Vyc29y", "/w=="])
def test_a_cursor_the_service_did_not_issue_is_invalid(bad: str) -> None:
    with pytest.raises(Invalid):
        cursors.decode(bad)


def test_a_page_has_a_cursor_only_when_more_rows_follow() -> None:
    rows = [(float(i), f"id{i}") for i in range(3)]
    assert cursors.page(rows, 3, lambda r: r) == (rows, None)
    kept, cursor = cursors.page(rows, 2, lambda r: r)
    assert kept == rows[:2]
    assert cursor is not None and cursors.decode(cursor) == rows[1]
