"""Answers in flight per tenant (RAG_QUOTA__MAX_CONCURRENT_ASKS): one tenant's many questions
get 429 beyond its limit while other tenants are answered; a slot is freed however its
answer ends (done, or the client gone mid-stream). Real HTTP, a fake generator."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rag.config import QuotaSettings
from tests.answer.conftest import FakeEngine, LiveApi, ingest

FACT = "The ferry to the island leaves from pier four at nine every morning."


def _chat(api: LiveApi, headers: dict[str, str], model: str, **body: Any) -> Any:
    messages = [{"role": "user", "content": FACT}]
    return api.client.post(
        "/v1/chat/completions", json={"model": model, "messages": messages, **body}, headers=headers
    )


def test_one_tenant_past_its_limit_gets_429_and_others_are_answered(
    live_api: Callable[..., LiveApi], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = FakeEngine(answer=" ".join(["word"] * 400), delay_s=0.02)  # ~8 s if read to the end
    api = live_api(
        sqlite_url, hash_embedder, engine, update={"quota": QuotaSettings(max_concurrent_asks=1)}
    )
    api.services.settings.ask.relevance_threshold = -1.0
    # Every passage to the generator, the answer streamed as written: the first answer stays
    # in flight while the others are asked (one passage would stop at its first sentence).
    api.services.settings.ask.evidence = "all"
    cid_a, cid_b = api.collection(api.a), api.collection(api.b)
    ingest(api, api.a, cid_a, [FACT])
    ingest(api, api.b, cid_b, [FACT])
    assert not api.services.asks._held  # nothing in flight yet
    with api.client.stream(
        "POST",
        f"/v1/collections/{cid_a}/ask",
        json={"question": FACT, "stream": True},
        headers=api.a,
    ) as first:
        assert first.status_code == 200
        lines = first.iter_lines()
        assert next(lines).startswith("event: passages")
        # Tenant a's second question, by either route, is refused at once.
        r = api.client.post(f"/v1/collections/{cid_a}/ask", json={"question": FACT}, headers=api.a)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "overloaded" and r.headers["Retry-After"] == "1"
        assert "at most 1 at once" in r.json()["error"]["message"]
        assert _chat(api, api.a, cid_a).status_code == 429
        assert _chat(api, api.a, "smollm2").status_code == 429
        # Tenant b is answered meanwhile.
        engine.answer, long_answer = "Nine [1].", engine.answer
        r = api.client.post(f"/v1/collections/{cid_b}/ask", json={"question": FACT}, headers=api.b)
        assert r.status_code == 200, r.text
        assert _chat(api, api.b, cid_b).status_code == 200
        engine.answer = long_answer
    # The first client went away mid-stream: its slot is freed with its generation.
    deadline = time.monotonic() + 10
    while any(api.services.asks._held.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(api.services.asks._held.values())
    engine.answer = "Nine [1]."
    r = api.client.post(f"/v1/collections/{cid_a}/ask", json={"question": FACT}, headers=api.a)
    assert r.status_code == 200, r.text
    for _ in range(3):  # finished answers free their slot: one after the other is fine
        assert _chat(api, api.a, cid_a).status_code == 200
        assert _chat(api, api.a, cid_a, stream=True).status_code == 200
    assert not any(api.services.asks._held.values())


def test_a_refused_answer_frees_its_slot(
    live_api: Callable[..., LiveApi], sqlite_url: str, hash_embedder: Any
) -> None:
    """An answer refused or failing before it starts (unknown collection, full engine)
    gives its slot back."""
    engine = FakeEngine(waiting=8, max_waiting=8)  # full: every generation is refused
    api = live_api(
        sqlite_url, hash_embedder, engine, update={"quota": QuotaSettings(max_concurrent_asks=1)}
    )
    cid = api.collection(api.a)
    for _ in range(3):
        r = api.client.post(f"/v1/collections/{cid}/ask", json={"question": FACT}, headers=api.a)
        assert r.status_code == 429 and "generator" in r.json()["error"]["message"]
        assert _chat(api, api.a, "no-such-model").status_code == 404
    assert not any(api.services.asks._held.values())
