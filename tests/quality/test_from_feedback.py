"""`rag eval --from-feedback`: rated answers become an evaluation set (up: the answer and its
passages' documents; down: the correction), and a settings change is measured on it beside
the collection's own before it is applied."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rag.cli import build_parser
from rag.ops import eval as evaluation
from rag.ops.feedback_eval import from_feedback
from tests.conftest import Api
from tests.quality.conftest import FACTS, flush, ingest, quality_api


def _rated(api: Api) -> tuple[str, list[str], dict[str, str]]:
    cid = api.collection(api.a, name="harbour")
    docs = ingest(api, api.a, cid, FACTS)

    def ask(question: str, doc: str) -> str:
        body = {"question": question, "k": 1, "filter": {"document_ids": [doc]}}
        r = api.client.post(f"/v1/collections/{cid}/ask", json=body, headers=api.a)
        assert r.status_code == 200, r.text
        return str(r.json()["answer_id"])

    ids = {
        "up": ask("When does the ferry leave?", docs[0]),
        "corrected": ask("When does the fish market close?", docs[1]),
        "down": ask("Which radio channel has storm warnings?", docs[1]),
        "unrated": ask("Where is pier four?", docs[0]),
    }
    flush(api)

    def rate(answer_id: str, **body: Any) -> None:
        r = api.client.post(f"/v1/answers/{answer_id}/feedback", json=body, headers=api.a)
        assert r.status_code == 200, r.text

    rate(ids["up"], rating="down")  # replaced by the next one: the last rating counts
    rate(ids["up"], rating="up")
    rate(ids["corrected"], rating="down", correct_answer="At noon on Sundays.",
         correct_document_id=docs[2])  # fmt: skip
    rate(ids["down"], rating="down", comment="wrong")
    return cid, docs, ids


def test_rated_answers_become_judged_queries(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any, tmp_path: Path
) -> None:
    api = quality_api(make_api, db_url, hash_embedder)
    cid, docs, ids = _rated(api)
    collection = evaluation.resolve_collection(api.services, cid)
    made = from_feedback(api.services, collection)
    assert set(made.queries) == {ids["up"], ids["corrected"]}
    assert made.queries[ids["up"]] == "When does the ferry leave?"
    assert made.qrels == {ids["up"]: {"doc0": 1}, ids["corrected"]: {"doc2": 1}}
    assert made.answers[ids["corrected"]] == "At noon on Sundays."
    assert made.answers[ids["up"]]  # the answer given, rated right
    assert made.skipped_no_correction == 1 and made.skipped_no_text == 0
    queries = made.write(tmp_path / "set")
    assert evaluation.read_queries(queries) == made.queries
    assert evaluation.read_qrels(queries.with_name("qrels.tsv")) == made.qrels


def test_rag_eval_from_feedback_measures_a_candidate_beside_the_current_settings(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    api = quality_api(make_api, sqlite_url, hash_embedder)
    cid, _, _ = _rated(api)
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_DATABASE__URL", sqlite_url)
    monkeypatch.setenv("RAG_EMBED__BACKEND", "hash")
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")
    monkeypatch.setenv("RAG_ASK__MODE", "extractive")  # answers without loading a generator
    out = tmp_path / "from-feedback"
    args = build_parser().parse_args(
        [
            "eval",
            cid,
            "--from-feedback",
            "--out",
            str(out),
            "--candidate",
            '{"hybrid": 0.5}',
            "--json",
        ]  # fmt: skip
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "2 rated answers" in captured.err and "1 rated down without a correction" in captured.err
    assert report["queries"] == 2
    assert set(report["retrieval"]) == {"collection", "exact", "candidate"}
    assert report["answers"]["answered"] == report["candidate_answers"]["answered"] == 2
    assert (out / "queries.jsonl").exists() and (out / "answers.jsonl").exists()
    for bad in ['{"hybrid": 2}', "[1]", "not json", '{"speed": 1}']:
        args = build_parser().parse_args(["eval", cid, "--from-feedback", "--candidate", bad])
        with pytest.raises(SystemExit, match="--candidate"):
            args.func(args)
    args = build_parser().parse_args(["eval", cid])
    with pytest.raises(SystemExit, match="--from-feedback"):
        args.func(args)
