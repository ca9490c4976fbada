"""HNSW's default ef_search grows with the collection; an explicit one is kept, saved and loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag.index import Knobs, build_index
from rag.index.base import auto_ef_search


def test_auto_ef_search_grows_with_size_and_is_capped() -> None:
    assert auto_ef_search(0) == auto_ef_search(100_000) == 128
    sizes = [100_000, 200_000, 500_000, 1_000_000]
    values = [auto_ef_search(n) for n in sizes]
    assert values == sorted(values) and len(set(values)) == len(values)
    # bench/search.py measures the recall at 1M (docs/decisions.md, "Default ef_search").
    assert 600 <= auto_ef_search(1_000_000) <= 700
    assert auto_ef_search(10**9) == 1024


@pytest.mark.parametrize("kind", ["hnsw", "faiss_hnsw"])
def test_default_follows_the_size_and_an_explicit_one_survives_a_round_trip(
    kind: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(300, dtype=np.int64)

    auto = build_index(kind, 16)
    auto.add(ids, vectors)
    assert auto.params["ef_search"] is None  # saved as "auto", not as today's value
    assert auto.default_ef_search() == 128

    fixed = build_index(kind, 16, {"ef_search": 40})
    fixed.add(ids, vectors)
    assert fixed.default_ef_search() == 40
    for index, name in ((auto, "auto"), (fixed, "fixed")):
        (tmp_path / name).mkdir()
        index.save(tmp_path / name)
    loaded = type(fixed).load(tmp_path / "fixed")
    assert loaded.default_ef_search() == 40 and loaded.params["ef_search"] == 40
    reloaded = type(auto).load(tmp_path / "auto")
    assert reloaded.params["ef_search"] is None and reloaded.default_ef_search() == 128
    # Searches without an ef use the default; a query's own vector comes back first.
    hits = reloaded.search(vectors[:3], Knobs(k=5))
    assert [int(h.ids[0]) for h in hits] == [0, 1, 2]
