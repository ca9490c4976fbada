"""Hybrid fusion (rag.retrieve.fuse): z-scores of both sides in a convex combination, worked by
hand on small lists."""

from __future__ import annotations

import numpy as np
import pytest

from rag.index.base import Hits
from rag.retrieve import fuse


def _hits(pairs: list[tuple[int, float]]) -> Hits:
    return Hits(
        np.array([i for i, _ in pairs], np.int64), np.array([s for _, s in pairs], np.float32)
    )


def _z(values: list[float]) -> np.ndarray:
    v = np.array(values, np.float64)
    return (v - v.mean()) / v.std()


DENSE = _hits([(1, 0.9), (2, 0.8), (3, 0.5)])


def test_weight_zero_or_no_keyword_hits_is_dense_unchanged() -> None:
    want = [(1, 0.9, 0.9, None), (2, 0.8, 0.8, None), (3, 0.5, 0.5, None)]
    for got in (fuse(DENSE, [(3, 7.0)], 0.0, 10), fuse(DENSE, [], 0.5, 10)):
        assert [(i, round(s, 6), round(d or 0, 6), k) for i, s, d, k in got] == want
    assert [r[0] for r in fuse(DENSE, [], 0.5, 2)] == [1, 2]


def test_scores_are_the_convex_combination_of_z_scores() -> None:
    # Candidates 1, 2, 3 (dense) and 4 (keyword only, cosine 0.4 from its vector).
    keyword = [(3, 9.0), (4, 6.0), (2, 3.0)]
    got = fuse(DENSE, keyword, 0.3, 10, cosines={4: 0.4})
    dense_z = dict(zip([1, 2, 3, 4], _z([0.9, 0.8, 0.5, 0.4]), strict=True))
    hit_z = dict(zip([3, 4, 2], _z([9.0, 6.0, 3.0]), strict=True))
    hit_z[1] = min(hit_z.values())  # not a keyword hit: counts as the lowest one
    want = {c: 0.7 * dense_z[c] + 0.3 * hit_z[c] for c in (1, 2, 3, 4)}
    assert [r[0] for r in got] == sorted(want, key=lambda c: -want[c])
    for chunk_id, score, cosine, bm25 in got:
        assert score == pytest.approx(want[chunk_id], abs=1e-6)
        assert cosine == pytest.approx({1: 0.9, 2: 0.8, 3: 0.5, 4: 0.4}[chunk_id], abs=1e-6)
        assert bm25 == dict(keyword).get(chunk_id)


def test_a_keyword_hit_without_a_known_cosine_counts_as_the_lowest() -> None:
    got = fuse(DENSE, [(9, 5.0), (3, 1.0)], 0.5, 10)
    by_id = {r[0]: r for r in got}
    assert set(by_id) == {1, 2, 3, 9}
    assert by_id[9][2] is None  # no cosine reported for it
    dense_z = _z([0.9, 0.8, 0.5, 0.5])  # 9 scored as the lowest cosine
    assert by_id[9][1] == pytest.approx(0.5 * dense_z[3] + 0.5 * 1.0, abs=1e-6)


def test_a_lone_keyword_hit_is_still_a_signal() -> None:
    """One keyword hit (or hits all scoring alike) has no spread: the hits score 0 and the
    other candidates one unit below."""
    got = fuse(DENSE, [(2, 4.0)], 0.5, 10)
    dense_z = _z([0.9, 0.8, 0.5])
    scores = {r[0]: r[1] for r in got}
    assert scores[2] == pytest.approx(0.5 * dense_z[1], abs=1e-6)
    assert scores[1] == pytest.approx(0.5 * dense_z[0] - 0.5, abs=1e-6)
    assert [r[0] for r in got] == [2, 1, 3]


def test_ties_keep_the_dense_order_and_the_limit_holds() -> None:
    flat = _hits([(5, 0.7), (6, 0.7), (7, 0.7)])
    got = fuse(flat, [(5, 2.0), (6, 2.0), (7, 2.0)], 0.4, 2)
    assert [r[0] for r in got] == [5, 6]
    keyword_only = fuse(_hits([]), [(8, 3.0), (9, 1.0)], 1.0, 10, cosines={8: 0.1, 9: 0.2})
    assert [r[0] for r in keyword_only] == [8, 9]
