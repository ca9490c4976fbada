"""The milvus backend's own seams: filters as Milvus expressions (and what stays out of
them), knobs mapped to Milvus's search parameters, the budget as the call's timeout, and an
engine that is down failing the request, not the service."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rag.config import MilvusSettings
from rag.errors import Invalid
from rag.index import Knobs, build_index
from rag.index.filters import Where, matches
from rag.index.milvus import MilvusEngine, MilvusIndex, VectorEngineUnavailable
from rag.index.milvus.filters import expression, literal
from tests.support.milvus import milvus_engine, milvus_uri  # noqa: F401  (fixtures)

DIM = 8


def test_filters_that_map_become_one_expression() -> None:
    e = expression(Where(("a1", "b2"), {"team": "ops", "n": 3, "x": 1.5, "ok": True}))
    assert e.complete and e.document_ids_pushed
    assert e.text == (
        'document_id in ["a1", "b2"] and meta["team"] == "ops" and meta["n"] == 3 '
        'and meta["x"] == 1.5 and meta["ok"] == true'
    )
    assert expression(None).text == "" and expression(Where()).complete


@pytest.mark.parametrize(
    "metadata",
    [
        {"team": 'o"ps) or (id > 0'},  # a quote would end the literal
        {"team": "back\\slash"},
        {'te"am': "ops"},  # a key outside the safe alphabet
        {"n": float("nan")},
        {"n": 2**70},
    ],
)
def test_what_does_not_map_stays_out_of_the_expression(metadata: dict) -> None:
    e = expression(Where(None, {**metadata, "kind": "odd"}))
    assert not e.complete
    assert e.text == 'meta["kind"] == "odd"'  # only the part that maps
    assert e.metadata_pushed == ("kind",)


def test_literals() -> None:
    assert literal(True) == "true" and literal(0) == "0" and literal("a b") == '"a b"'
    assert literal("\x00") is None and literal(float("inf")) is None


def test_rows_are_matched_with_sqls_equality() -> None:
    where = Where(("d1",), {"n": 3, "ok": True, "team": "ops"})
    assert matches(where, "d1", {"n": 3.0, "ok": True, "team": "ops"})
    assert not matches(where, "d2", {"n": 3, "ok": True, "team": "ops"})
    assert not matches(where, "d1", {"n": 3, "ok": 1, "team": "ops"})  # 1 is not true
    assert not matches(Where(None, {"n": 1}), "d1", {"n": True})  # true is not 1
    assert not matches(where, "d1", {"n": 3, "ok": True})


def test_parameters_are_checked_before_anything_is_created() -> None:
    assert build_index("milvus", DIM).params["index_type"] == "HNSW"
    for bad in ({"index_type": "DISKANN"}, {"m": 100_000}, {"nlist": 0}, {"ef_search": True}):
        with pytest.raises(Invalid):
            build_index("milvus", DIM, bad)
    with pytest.raises(Invalid, match="not bound"):
        build_index("milvus", DIM).search(np.zeros((1, DIM), np.float32), Knobs())


@pytest.fixture
def index(milvus_engine: MilvusEngine) -> Iterator[MilvusIndex]:  # noqa: F811
    made = MilvusIndex(DIM).bind(milvus_engine, milvus_engine.new_name(uuid.uuid4().hex[:12]))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, DIM)).astype(np.float32)
    made.add(np.arange(200), x / np.linalg.norm(x, axis=1, keepdims=True))
    yield made
    made.drop()


def test_knobs_become_milvus_search_parameters(index: MilvusIndex) -> None:
    assert index._search_params(Knobs(k=10, ef_search=64), 10)["params"] == {"ef": 64}
    # ef below the limit is raised to it (Milvus refuses ef < limit).
    assert index._search_params(Knobs(k=10, ef_search=4), 10)["params"] == {"ef": 10}
    assert index._search_params(Knobs(k=10, exact=True), 10)["params"] == {"ef": 200}
    ivf = MilvusIndex(DIM, index_type="IVF_FLAT", nlist=32)
    assert ivf._search_params(Knobs(k=10, nprobe=4), 10)["params"] == {"nprobe": 4}
    assert ivf._search_params(Knobs(k=10, nprobe=400), 10)["params"] == {"nprobe": 32}
    assert ivf._search_params(Knobs(k=10, exact=True), 10)["params"] == {"nprobe": 32}
    assert ivf.effort_knob == "nprobe" and index.effort_knob == "ef_search"
    assert MilvusIndex(DIM, index_type="FLAT").effort_knob is None


class Recording:
    """The real client, recording each search's timeout; `fail` makes the next search raise
    what gRPC raises when a deadline passes."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.timeouts: list[float | None] = []
        self.fail = False

    def search(self, *args: Any, **kwargs: Any) -> Any:
        self.timeouts.append(kwargs.get("timeout"))
        if self.fail:
            raise DeadlineExceeded()
        return self.client.search(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class DeadlineExceeded(Exception):
    def code(self) -> Any:
        return type("Status", (), {"name": "DEADLINE_EXCEEDED"})()


def test_the_budget_is_the_calls_timeout(index: MilvusIndex) -> None:
    engine = index._engine
    assert engine is not None
    recording = Recording(engine.client)
    engine._client = recording
    try:
        q = np.ones((1, DIM), np.float32) / np.sqrt(DIM)
        assert len(index.search(q, Knobs(k=5, budget_ms=250))[0]) == 5
        assert len(index.search(q, Knobs(k=5))[0]) == 5  # no budget: the configured timeout
        assert recording.timeouts == [0.25, engine.settings.search_timeout_s]
        recording.fail = True
        with pytest.raises(VectorEngineUnavailable) as caught:
            index.search(q, Knobs(k=5, budget_ms=1))
        assert caught.value.code == "vector_engine_unavailable" and caught.value.retry_after_s > 0
    finally:
        engine._client = recording.client


def test_an_engine_that_is_down_fails_the_call_quickly() -> None:
    engine = MilvusEngine(MilvusSettings(uri="http://127.0.0.1:1", call_timeout_s=5))
    with pytest.raises(VectorEngineUnavailable):
        MilvusIndex(DIM).bind(engine, "anything")
    engine.close()
