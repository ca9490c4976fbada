"""`rag eval --choose-hybrid`: a keyword weight chosen on the even-numbered judged queries,
kept only when the odd-numbered ones do at least as well as dense, stored on request.

The embedder is a table: each query's vector is its decoy passage's, and the passage that
answers it is at cosine 0.97 but holds the query's two rare words, which the decoy lacks. Dense
search puts the decoy first (nDCG@10 of the answer at rank 2: 1/log2(3)); the keyword side
lifts the answer above it at the weights tried past 0.05.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from rag.cli import build_parser
from rag.embed import HashEmbedder
from rag.errors import Invalid
from rag.knobs import Knobs
from rag.ops import eval as evaluation
from tests.conftest import Api

N = 4  # queries, each with an answer and a decoy


class TableEmbedder(HashEmbedder):
    """Vectors looked up by text; anything else hashed."""

    def __init__(self, table: dict[str, npt.NDArray[np.float32]]) -> None:
        super().__init__(2 * N)
        self.table = table

    def embed(self, texts: Sequence[str], deadline: object = None) -> npt.NDArray[np.float32]:
        hashed = super().embed(texts)
        return np.stack([self.table.get(t, h) for t, h in zip(texts, hashed, strict=True)])


def _unit(i: int) -> npt.NDArray[np.float32]:
    v = np.zeros(2 * N, np.float32)
    v[i] = 1.0
    return v


def _set() -> tuple[dict[str, str], dict[str, str], TableEmbedder]:
    """(query text by query id, passage text by corpus id, the embedder)."""
    queries, docs, table = {}, {}, {}
    for i in range(N):
        queries[f"q{i}"] = f"zebra{i} violin{i}"
        docs[f"answer{i}"] = f"zebra{i} violin{i} tuning notes"
        docs[f"decoy{i}"] = f"decoy{i} unrelated words"
        table[queries[f"q{i}"]] = _unit(i)
        table[docs[f"decoy{i}"]] = _unit(i)
        table[docs[f"answer{i}"]] = 0.97 * _unit(i) + math.sqrt(1 - 0.97**2) * _unit(N + i)
    return queries, docs, TableEmbedder(table)


def _load(make_api: Callable[..., Api], db_url: str) -> tuple[Api, str, dict[str, str]]:
    queries, docs, embedder = _set()
    api = make_api(db_url, embedder)
    cid = api.collection(api.a, name="hybridset")
    for corpus_id, text in docs.items():
        item = api.upload_text(api.a, cid, text, metadata={"_id": corpus_id})
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    return api, cid, queries


def test_a_weight_that_helps_both_halves_is_chosen_and_stored(
    make_api: Callable[..., Api], db_url: str
) -> None:
    api, cid, queries = _load(make_api, db_url)
    qrels = {f"q{i}": {f"answer{i}": 1} for i in range(N)}
    collection = evaluation.resolve_collection(api.services, "hybridset")
    choice = evaluation.choose_hybrid(api.services, collection, queries, qrels, apply=True)
    dense = 1 / math.log2(3)
    assert choice.ndcg[0.0] == pytest.approx((dense, dense))
    assert choice.chosen == 0.1  # the smallest weight that puts every answer first
    assert choice.ndcg[0.1] == pytest.approx((1.0, 1.0))
    assert choice.applied
    # Stored: a search that sets no weight now fuses at the chosen one.
    result = api.services.retriever.search(collection.tenant_id, cid, queries["q1"], Knobs(k=3))
    assert result.knobs.hybrid == 0.1 and result.saved["hybrid"] == 0.1
    assert result.passages[0].metadata["_id"] == "answer1"


def test_dense_is_kept_when_keyword_hits_do_not_help(
    make_api: Callable[..., Api], db_url: str
) -> None:
    api, cid, queries = _load(make_api, db_url)
    qrels = {f"q{i}": {f"decoy{i}": 1} for i in range(N)}  # the decoys are what is wanted
    collection = evaluation.resolve_collection(api.services, "hybridset")
    choice = evaluation.choose_hybrid(api.services, collection, queries, qrels, apply=True)
    assert choice.chosen == 0.0 and choice.ndcg[0.0] == pytest.approx((1.0, 1.0))
    result = api.services.retriever.search(collection.tenant_id, cid, queries["q1"], Knobs(k=3))
    assert result.knobs.hybrid == 0.0
    assert result.passages[0].metadata["_id"] == "decoy1"


def test_a_weight_the_odd_half_disagrees_with_is_not_kept(
    make_api: Callable[..., Api], db_url: str
) -> None:
    api, _, queries = _load(make_api, db_url)
    # Even-numbered queries (q0, q2) want the answer, odd-numbered ones (q1, q3) the decoy.
    qrels = {f"q{i}": {f"answer{i}" if i % 2 == 0 else f"decoy{i}": 1} for i in range(N)}
    collection = evaluation.resolve_collection(api.services, "hybridset")
    choice = evaluation.choose_hybrid(api.services, collection, queries, qrels)
    assert choice.ndcg[0.1][0] == pytest.approx(1.0)  # best on the half it is chosen on
    assert choice.ndcg[0.1][1] < choice.ndcg[0.0][1]  # worse than dense on the other
    assert choice.chosen == 0.0 and not choice.applied
    with pytest.raises(Invalid, match="two judged queries"):
        evaluation.choose_hybrid(api.services, collection, {"q0": queries["q0"]}, qrels)


def test_rag_eval_choose_hybrid_apply(
    make_api: Callable[..., Api],
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api, cid, queries = _load(make_api, sqlite_url)
    qpath, rpath = tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    qpath.write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    rpath.write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tanswer{i}\t1\n" for i in range(N))
    )
    _, _, embedder = _set()
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_DATABASE__URL", sqlite_url)
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")
    # The command builds its own services: give them the table embedder.
    monkeypatch.setattr("rag.services.build_embedder", lambda settings: embedder)
    args = build_parser().parse_args(
        ["eval", cid, "--queries", str(qpath), "--choose-hybrid", "--apply", "--json"]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hybrid"]["chosen"] == 0.1 and out["hybrid"]["applied"] is True
    assert out["hybrid"]["ndcg10"]["0.1"] == {"even": 1.0, "odd": 1.0}
    collection = evaluation.resolve_collection(api.services, cid)
    assert collection.search_defaults["hybrid"] == 0.1

    args = build_parser().parse_args(["eval", cid, "--queries", str(qpath), "--apply"])
    with pytest.raises(SystemExit, match="give both"):
        args.func(args)
