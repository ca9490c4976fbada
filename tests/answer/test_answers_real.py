"""Answers with the real models (SmolLM2-135M and all-MiniLM-L6-v2) over real HTTP: refusal of a
question the documents do not answer (without the generator) and none of one they do (the
quote first), valid citations and `sources` through the official openai client, and an
extractive answer whose spans are the document's text. (The repetition stop is tested with a
fake generator in tests/answer/test_answers.py: the loop the real model wrote came with the
legacy prompt, now gone.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rag.answer import NOT_FOUND
from rag.config import AskSettings
from tests.answer.conftest import Borrowed, LiveApi, ingest, parse_sse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
    "The fish market opens before dawn and closes at noon on Sundays.",
    "Hotel costs are reimbursed up to 180 euros per night in Berlin.",
    "The VPN client is called WireGuard. Install it from the software centre.",
]


def _valid(final: dict[str, Any], given: list[dict[str, Any]]) -> None:
    for c in final["citations"]:
        assert 1 <= c["marker"] <= len(given)
        assert c["chunk_id"] == given[c["marker"] - 1]["chunk_id"]
        for s, e in c["sentences"]:
            assert 0 <= s < e <= len(final["answer"])


def test_refuses_what_the_documents_do_not_say_and_answers_what_they_do(
    live_api: Callable[..., LiveApi], sqlite_url: str, minilm: Any, smollm_engine: Any
) -> None:
    # Every passage passes the relevance threshold, as in a large collection where some
    # passage is always vaguely similar: the evidence decides.
    update = {"ask": AskSettings(relevance_threshold=-1.0)}
    api = live_api(sqlite_url, minilm, engine=Borrowed(smollm_engine), update=update)
    cid = api.collection(api.a, name="handbook")
    ingest(api, api.a, cid, FACTS)
    url = f"/v1/collections/{cid}/ask"
    generated = smollm_engine.metrics().generated_tokens
    for question in ("What is the capital of Vrelnia?", "What does the Zorblax X200 cost?"):
        r = api.client.post(url, json={"question": question, "max_tokens": 32}, headers=api.a)
        body = r.json()
        assert body["finish_reason"] == "no_evidence" and body["answer"] == NOT_FOUND, body
        assert body["citations"] == []
    assert smollm_engine.metrics().generated_tokens == generated  # no generation at all

    r = api.client.post(url, json={"question": "How much are hotel costs reimbursed in Berlin?",
                                   "k": 3, "max_tokens": 48, "stream": True},
                        headers=api.a)  # fmt: skip
    events = parse_sse(r.text)
    given, final = events[0][1]["passages"], events[-1][1]
    assert final["finish_reason"] == "stop", final
    # The quote of the one passage that answers, first; then a sentence only if it agrees.
    assert [p["text"] for p in given] == [FACTS[3]]
    assert final["answer"].startswith(f"{FACTS[3]} [1]")
    assert events[1][1]["text"] == f"{FACTS[3]} [1]"
    assert final["answer_source"] in ("generated", "quoted")
    if final["answer_source"] == "quoted":
        assert final["answer"] == f"{FACTS[3]} [1]"
    assert "[n]" not in final["answer"]
    _valid(final, given)
    assert smollm_engine.metrics().generated_tokens > generated


def test_openai_client_gets_sources_for_the_passages_given(
    live_api: Callable[..., LiveApi], sqlite_url: str, minilm: Any, smollm_engine: Any
) -> None:
    import openai

    # Three passages given, always, in one prompt (the path where `sources` lists several).
    update = {"ask": AskSettings(relevance_threshold=-1.0, evidence="all")}
    api = live_api(sqlite_url, minilm, engine=Borrowed(smollm_engine), update=update)
    cid = api.collection(api.a, name="handbook")
    docs = ingest(api, api.a, cid, FACTS)
    key = api.a["Authorization"].removeprefix("Bearer ")
    client = openai.OpenAI(base_url=f"{api.server.url}/v1", api_key=key, max_retries=0)
    question = [{"role": "user", "content": "What is the VPN client called?"}]
    out = client.chat.completions.create(model="handbook", messages=question, max_tokens=48,
                                         frequency_penalty=0.5, extra_body={"k": 3})  # type: ignore[arg-type]  # fmt: skip
    extra = out.model_extra or {}
    sources, passages = extra["sources"], extra["passages"]
    assert len(sources) == len(passages) == 3  # every passage given, not only the cited
    assert [s["chunk_id"] for s in sources] == [p["chunk_id"] for p in passages]
    assert all(s["document_id"] in docs for s in sources)
    assert all(isinstance(s["cited"], bool) for s in sources)
    reason = (out.choices[0].model_extra or {})["ragserve_finish_reason"]
    assert out.choices[0].finish_reason == "stop" or reason == "length"
    assert reason in ("stop", "length", "repetition")

    # Extractive, per request: the quote's span is the document's own text.
    texts = dict(zip(docs, FACTS, strict=True))
    out = client.chat.completions.create(model="handbook", messages=question,
                                         extra_body={"k": 3, "mode": "extractive"})  # type: ignore[arg-type]  # fmt: skip
    extra = out.model_extra or {}
    quotes = extra["ragserve"]["quotes"]
    assert quotes and "WireGuard" in (out.choices[0].message.content or "")
    for q in quotes:
        assert texts[q["document_id"]][q["start_char"] : q["end_char"]] == q["text"]
    assert [s["cited"] for s in extra["sources"]].count(True) == 1


PLANS = [
    "Backups on the Bronze plan are kept for 7 days and restored within two business days.",
    "Backups on the Silver plan are kept for 30 days and restored within one business day.",
    "Backups on the Gold plan are kept for 90 days and restored within four hours.",
    "Every plan is billed monthly; an annual contract earns a discount of ten percent.",
]


def test_an_answer_reads_passages_by_keywords_too_unless_told_otherwise(
    live_api: Callable[..., LiveApi], sqlite_url: str, minilm: Any
) -> None:
    # Near-duplicates that differ by a plan's name: the keyword side matches the name the
    # question gives, so an answer reads with it by default (ask.hybrid), while a search,
    # the request and the collection's saved defaults keep their own weights.
    api = live_api(sqlite_url, minilm)
    cid = api.collection(api.a, name="plans")
    ingest(api, api.a, cid, PLANS)
    url = f"/v1/collections/{cid}/ask"
    question = {"question": "How long are Silver backups kept?", "mode": "extractive", "k": 2}

    def ask(**extra: Any) -> dict[str, Any]:
        r = api.client.post(url, json={**question, **extra}, headers=api.a)
        assert r.status_code == 200, r.text
        return r.json()

    out = ask()
    assert out["knobs"]["hybrid"] == AskSettings().hybrid > 0
    assert "retrieve.keyword" in out["timings_ms"]
    assert "30 days" in out["answer"] and "Silver" in out["answer"]
    assert ask(hybrid=0)["knobs"]["hybrid"] == 0
    search = api.client.post(f"/v1/collections/{cid}/search", json={"query": "Silver backups"},
                             headers=api.a)  # fmt: skip
    assert search.json()["knobs"]["hybrid"] == 0
    r = api.client.put(f"/v1/collections/{cid}/search-defaults", json={"hybrid": 0.2},
                       headers=api.a)  # fmt: skip
    assert r.status_code == 200, r.text
    assert ask()["knobs"]["hybrid"] == 0.2
