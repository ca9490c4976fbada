"""Index build parameters are held against the bounds each backend declares before anything
is allocated: unknown or out-of-range ones are a clear 422, and no index is built for them."""

from __future__ import annotations

from typing import Any

import pytest

from rag.errors import Invalid
from rag.index import KINDS, check_params, index_class
from tests.conftest import Api


@pytest.mark.parametrize(
    ("kind", "params", "says"),
    [
        ("hnsw", {"initial_capacity": 10_000_000}, "initial_capacity"),
        ("hnsw", {"m": 5_000_000}, "between 2 and 128"),
        ("hnsw", {"m": 1.5}, "integer"),
        ("hnsw", {"m": True}, "integer"),
        ("hnsw", {"ef_construction": "big"}, "integer"),
        ("hnsw", {"M": 16}, "unknown: 'M'"),
        ("faiss_hnsw", {"m": 1_000_000}, "between 2 and 128"),
        ("faiss_ivf", {"nlist": 10**9}, "nlist"),
        ("faiss_ivf_sq8", {"nprobe": 0}, "nprobe"),
        ("faiss_ivf", {"min_train": -1}, "min_train"),
        ("faiss_flat", {"use_gpu": 1}, "true or false"),
        ("faiss_flat", {"nlist": 4}, "takes use_gpu"),
        ("exact", {"m": 4}, "takes no parameters"),
        ("auto", {"m": 4}, "choose a kind"),
    ],
)
def test_out_of_bounds_or_unknown_is_invalid(kind: str, params: dict, says: str) -> None:
    with pytest.raises(Invalid, match=says):
        check_params(kind, params)


def test_within_bounds_passes_with_ints_as_ints() -> None:
    assert check_params("hnsw", {"m": 32.0, "ef_search": None}) == {"m": 32, "ef_search": None}
    assert check_params("faiss_ivf", {"nlist": 64, "use_gpu": False}) == {
        "nlist": 64,
        "use_gpu": False,
    }
    assert check_params("auto", {}) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_declares_what_its_constructor_takes(kind: str) -> None:
    import inspect

    cls = index_class(kind)
    takes = {
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }
    assert set(cls.param_schema) == takes


def test_the_api_refuses_before_allocating(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hnswlib

    built: list[Any] = []
    real = hnswlib.Index

    def recording(*args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(hnswlib, "Index", recording)
    api = sqlite_api
    r = api.client.post(
        "/v1/collections",
        json={"name": "big", "index": {"kind": "hnsw", "params": {"initial_capacity": 10**8}}},
        headers=api.a,
    )
    assert r.status_code == 422, r.text
    assert "initial_capacity" in r.json()["error"]["message"]
    assert built == []
    cid = api.collection(api.a, index={"kind": "hnsw", "params": {"m": 8}})
    r = api.client.post(
        f"/v1/collections/{cid}/index/rebuild",
        json={"kind": "faiss_hnsw", "params": {"m": 2_000_000}},
        headers=api.a,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid"
    row = api.client.get(f"/v1/collections/{cid}", headers=api.a).json()
    assert (row["index_kind"], row["index_params"]) == ("hnsw", {"m": 8})


@pytest.mark.parametrize("kind", ["faiss_ivf", "faiss_ivf_sq8"])
def test_ivf_lists_are_capped(kind: str) -> None:
    """k-means costs n x nlist x dim an iteration: 65,536 lists was minutes of CPU for one
    rebuild request. 4,096 suits up to ~1 M vectors (~4 sqrt(n)), and training never makes
    more lists than n / 39 (faiss's fewest training points a list)."""
    with pytest.raises(Invalid, match="nlist"):
        check_params(kind, {"nlist": 65_536})
    assert check_params(kind, {"nlist": 4096}) == {"nlist": 4096}
    import numpy as np

    index = index_class(kind)(8, nlist=4096, min_train=400)  # type: ignore[call-arg]
    vectors = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    index.add(np.arange(400, dtype=np.int64), vectors / np.linalg.norm(vectors, axis=1)[:, None])
    assert index._trained_nlist == 400 // 39  # type: ignore[attr-defined]
