"""The console's feedback buttons and Quality tab, in a real headless Chromium against the
real service on loopback: a rating given under an answer is stored; the tab plots the
collection's series and lists its unanswered topics with example questions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from rag.db import answers as sql
from rag.db.answers import NewAnswer
from rag.db.models import Feedback
from tests.console.conftest import Console
from tests.console.test_console import _api_collection, _by, _no_page_errors, _sign_in, _wait

LEAVE = [f"How many weeks of parental leave do I get, case {i}?" for i in range(6)]


def _upload(console: Console, cid: str, text: str) -> None:
    r = httpx.post(
        f"{console.url}/v1/collections/{cid}/documents", json={"text": text},
        headers=console.headers,
    )  # fmt: skip
    assert r.status_code == 202, r.text
    job = r.json()["documents"][0]["job_id"]
    _wait(
        lambda: httpx.get(f"{console.url}/v1/jobs/{job}", headers=console.headers).json()["done"],
        "the upload to be indexed",
    )


def _refused(console: Console, cid: str, tenant_id: str) -> None:
    """Refused questions about one thing, as the recorder writes them."""
    vectors = console.services.embedder.embed(LEAVE)
    rows = [
        NewAnswer(
            id=f"ans_leave{i:027d}",
            tenant_id=tenant_id,
            collection_id=cid,
            created_at=time.time() - 60 + i,
            question=q,
            question_embedding=v.astype("<f4").tobytes(),
            answer="",
            chunk_ids=[],
            document_ids=[],
            settings={},
            answer_source="refused",
            finish_reason="no_evidence",
            mode="generate",
            top_score=0.05,
            score_gap=0.0,
            unsupported=0,
            first_token_ms=None,
            latency_ms=8.0,
            weak=True,
        )  # fmt: skip
        for i, (q, v) in enumerate(zip(LEAVE, vectors, strict=True))
    ]
    with console.services.db.write() as s:
        sql.insert(s, rows)


@pytest.mark.slow
def test_rate_an_answer_then_watch_the_collections_quality(
    console: Console, browser: Any, shots: Path
) -> None:
    driver = browser
    cid = _api_collection(console, "handbook")
    _upload(console, cid, "Fredville is the capital of Freedonia. The river Fred runs through it.")
    _sign_in(driver, console)
    driver.get(f"{console.url}/console#/c/{cid}/ask")
    _wait(lambda: driver.find_element(*_by("#ask-question")).is_displayed(), "the ask form")
    driver.find_element(*_by("#ask-question")).send_keys("What is the capital of Freedonia?")
    driver.find_element(*_by("#ask-submit")).click()
    form = _wait(lambda: driver.find_element(*_by("#feedback")), "the feedback buttons")
    _wait(form.is_displayed, "the feedback buttons shown")
    driver.find_element(*_by("#feedback-comment")).send_keys("Right, and quick.")
    driver.find_element(*_by("#feedback-up")).click()
    _wait(lambda: "recorded" in driver.find_element(*_by("#feedback-status")).text, "thanks")
    with console.services.db.read() as s:
        (row,) = s.scalars(select(Feedback)).all()
    assert row.rating == "up" and row.comment == "Right, and quick."
    assert row.collection_id == cid

    with console.services.db.read() as s:
        from rag.db.models import Collection

        collection = s.get(Collection, cid)
        assert collection is not None
        tenant_id = collection.tenant_id
    _refused(console, cid, tenant_id)
    driver.find_element(*_by("#tab-quality")).click()
    _wait(lambda: driver.find_element(*_by("#chart-sources svg path.series")), "the chart")
    totals = driver.find_element(*_by("#quality-totals")).text
    assert totals.startswith("7 answers") and "6 refused" in totals and "1 up" in totals
    lines = {
        p.get_attribute("data-series")
        for p in driver.find_elements(*_by("#chart-sources path.series"))
    }
    assert {"generated", "refused"} <= lines
    assert driver.find_elements(*_by("#chart-latency path.series"))
    badge = driver.find_element(*_by('#quality-drift [data-kind="questions"]'))
    assert "not tested yet" in badge.text
    topic = _wait(lambda: driver.find_element(*_by("#topics > li")), "an unanswered topic")
    assert topic.get_attribute("data-count") == "6"
    examples = [li.text for li in topic.find_elements(*_by(".examples li"))]
    assert len(examples) == 5 and all("parental leave" in e for e in examples)
    driver.save_screenshot(str(shots / "console-quality.png"))
    _no_page_errors(driver)
