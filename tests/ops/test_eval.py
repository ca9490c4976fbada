"""`rag eval` on a hand-made set whose rankings are known, against numbers worked by hand.

The hash embedder is a bag of signed hashed words, so a four-word query's cosine with a
four-word passage is (shared words) / 4: d1 shares 4 words, d2 3, d3 2, d4 1, and the
ranking is d1, d2, d3, d4 whatever the index.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from rag.cli import build_parser
from rag.ops import eval as evaluation
from tests.conftest import Api

DOCS = {
    "d1": "alpha beta gamma delta",
    "d2": "alpha beta gamma zeta",
    "d3": "alpha beta eta theta",
    "d4": "alpha iota kappa lambda",
}
QUERY = "alpha beta gamma delta"


def _corpus(api: Api) -> tuple[str, dict[str, str]]:
    cid = api.collection(api.a, name="evalset")
    doc_ids = {}
    for name, text in DOCS.items():
        # d1..d3 name themselves by metadata `_id`, d4 by its filename.
        extra = {"filename": "d4.txt"} if name == "d4" else {"metadata": {"_id": name}}
        item = api.upload_text(api.a, cid, text, **extra)
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
        doc_ids[name] = item["document_id"]
    return cid, doc_ids


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        "\n".join(json.dumps({"_id": q, "text": QUERY}) for q in ("q1", "q2", "q3", "unjudged"))
        + "\n"
    )
    qrels = tmp_path / "qrels.tsv"
    # q1: d1 relevant (rank 1). q2: d3 (rank 3) and d4 with grade 2 (rank 4). q3: d2 and a
    # document that is not in the collection at all.
    qrels.write_text(
        "query-id\tcorpus-id\tscore\n"
        "q1\td1\t1\n"
        "q2\td3\t1\nq2\td4\t2\n"
        "q3\td2\t1\nq3\tmissing\t1\nq3\td1\t0\n"
    )
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        json.dumps({"_id": "q1", "answer": "The ferry leaves at nine."})
        + "\n"
        + json.dumps({"_id": "q2", "answer": "Channel sixteen"})
        + "\n"
    )
    return queries, qrels, answers


def _expected(k: int) -> dict[str, float]:
    log2 = math.log2
    recall = {2: [1.0, 0.0, 0.5], 10: [1.0, 1.0, 0.5]}[k]
    mrr = [1.0, 1 / 3, 1 / 2]
    ndcg_q2 = (1 / log2(4) + 2 / log2(5)) / (2 / log2(2) + 1 / log2(3))
    ndcg_q3 = (1 / log2(3)) / (1 / log2(2) + 1 / log2(3))
    ndcg = [1.0, ndcg_q2, ndcg_q3]
    return {
        f"recall@{k}": sum(recall) / 3,
        "mrr@10": sum(mrr) / 3,
        "ndcg@10": sum(ndcg) / 3,
    }


@pytest.mark.parametrize("k", [2, 10])
def test_eval_gives_the_numbers_worked_by_hand(
    make_api: Callable[..., Api], db_url: str, hash_embedder, tmp_path: Path, k: int
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(db_url, hash_embedder)
    cid, doc_ids = _corpus(api)
    queries, qrels, answers = _files(tmp_path)
    services = api.services
    collection = evaluation.resolve_collection(services, "evalset")
    assert collection.id == cid

    def fake_answer(_svc, tenant_id: str, collection_id: str, question: str):  # type: ignore[no-untyped-def]
        assert (tenant_id, collection_id, question) == (collection.tenant_id, cid, QUERY)
        answer_for = fake_answer.answers.pop(0)  # type: ignore[attr-defined]
        return answer_for

    # q1: exact answer, cites d1 (relevant) and d2 (not): precision 1/2.
    # q2: "channel 16" vs "channel sixteen": F1 = 2 * 1/2 * 1/2 / 1 = 0.5; cites d4: 1.
    fake_answer.answers = [  # type: ignore[attr-defined]
        evaluation.Answer("the ferry leaves at nine!", [doc_ids["d1"], doc_ids["d2"]]),
        evaluation.Answer("Channel 16", [doc_ids["d4"]]),
    ]
    report = evaluation.evaluate(
        services,
        collection,
        evaluation.read_queries(queries),
        evaluation.read_qrels(qrels),
        k=k,
        answers=evaluation.read_answers(answers),
        answer_fn=fake_answer,
    )
    assert report.queries == 3
    assert any("1 queries have no judgements" in n for n in report.notes)
    want = _expected(k)
    for setting in ("collection", "exact"):
        for name, value in want.items():
            assert report.retrieval[setting][name] == pytest.approx(value), (setting, name)
    assert report.answers is not None
    assert report.answers["answer_token_f1"] == pytest.approx((1.0 + 0.5) / 2)
    assert report.answers["citation_precision"] == pytest.approx((0.5 + 1.0) / 2)
    assert f"recall@{k}" in report.table()


def test_metric_functions_by_hand() -> None:
    rel = {"a": 1, "b": 3, "z": 0}
    ranking = ["x", "b", "y", "a"]
    assert evaluation.recall_at(ranking, rel, 2) == 0.5
    assert evaluation.recall_at(ranking, rel, 4) == 1.0
    assert evaluation.mrr_at(ranking, rel) == 0.5
    ideal = 3 + 1 / math.log2(3)
    assert evaluation.ndcg_at(ranking, rel) == pytest.approx(
        (3 / math.log2(3) + 1 / math.log2(5)) / ideal
    )
    assert evaluation.ndcg_at(["b", "a"], rel) == pytest.approx(1.0)
    assert evaluation.token_f1("The cat sat.", "a cat sat down") == pytest.approx(
        2 * 1 * (2 / 3) / (1 + 2 / 3)
    )
    assert evaluation.token_f1("", "") == 1.0 and evaluation.token_f1("x", "") == 0.0


def test_rag_eval_command_prints_json(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(sqlite_url, hash_embedder)
    cid, _ = _corpus(api)
    queries, qrels, answers = _files(tmp_path)
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_DATABASE__URL", sqlite_url)
    monkeypatch.setenv("RAG_EMBED__BACKEND", "hash")
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")
    args = build_parser().parse_args(
        ["eval", cid, "--queries", str(queries), "--qrels", str(qrels), "--k", "10", "--json"]
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "eval:" in captured.err and "/3 [" in captured.err  # the progress bar, on stderr
    want = _expected(10)
    assert out["queries"] == 3
    for name, value in want.items():
        assert out["retrieval"]["exact"][name] == pytest.approx(value)
        assert out["retrieval"]["collection"][name] == pytest.approx(value)


def test_answer_metrics_through_the_ask_path(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from tests.ops.conftest import RecordingEngine

    engine = RecordingEngine("The ferry leaves at nine [1].")
    api = make_api(sqlite_url, hash_embedder, engine=engine)
    # The answer as the generator writes it over the passages (evidence "all"): the metrics
    # are about that text and its markers.
    api.services.settings.ask.evidence = "all"
    _corpus(api)
    queries, qrels, answers = _files(tmp_path)
    fn = evaluation.default_answer_fn()
    assert fn is not None
    report = evaluation.evaluate(
        api.services,
        evaluation.resolve_collection(api.services, "evalset"),
        evaluation.read_queries(queries),
        evaluation.read_qrels(qrels),
        answers=evaluation.read_answers(answers),
        answer_fn=fn,
    )
    assert len(engine.prompts) == 2  # q1 and q2 have reference answers
    assert report.answers is not None
    # Both answers cite [1], the top passage d1: relevant to q1, not to q2.
    assert report.answers["citation_precision"] == pytest.approx(0.5)
    assert report.answers["answers_with_citations"] == 2
    # q1's reference is the answer itself (up to the marker); q2's shares no word.
    assert 0.4 < report.answers["answer_token_f1"] <= 0.5


def test_bad_lines_name_their_file_and_line(tmp_path: Path) -> None:
    from rag.errors import Invalid

    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"_id": "q1", "answer": "x"}\nnot json\n')
    with pytest.raises(Invalid, match=r"answers.jsonl:2: not a JSON object"):
        evaluation.read_answers(answers)
    answers.write_text('["q1", "x"]\n')
    with pytest.raises(Invalid, match=r"answers.jsonl:1"):
        evaluation.read_answers(answers)
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "x"}\n{"_id": "q2"}\n')
    with pytest.raises(Invalid, match=r"queries.jsonl:2"):
        evaluation.read_queries(queries)
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(Invalid, match=r"qrels.tsv:2"):
        evaluation.read_qrels(qrels)
