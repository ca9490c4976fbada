"""Warming a collection's passages into the real engine's passage cache: the first question
over them reuses their KV; another tenant cannot warm (or see) the collection."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from rag.config import AskSettings
from tests.answer.conftest import Borrowed, LiveApi, ingest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FACTS = [
    # A time the evidence rules know ("10 am"; "at ten" alone is not one): the question
    # below is answered, not refused before the generator.
    "The archive reading room opens at 10 am and closes at 4 pm on weekdays.",
    "Visitors must leave bags in the lockers beside the cloakroom.",
    "Photographs without flash are allowed for personal research only.",
]


def test_a_warmed_collection_answers_its_first_question_from_cached_passages(
    live_api: Callable[..., LiveApi], sqlite_url: str, minilm: Any, smollm_engine: Any
) -> None:
    # All three passages, every question, in one prompt (what a warmed cache serves).
    update = {"ask": AskSettings(relevance_threshold=-1.0, evidence="all")}
    api = live_api(sqlite_url, minilm, engine=Borrowed(smollm_engine), update=update)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    # Warming serves answers that reuse passage KV: the collection's default says so.
    r = api.client.put(f"/v1/collections/{cid}/search-defaults", json={"kv_reuse": "blend"},
                       headers=api.a)  # fmt: skip
    assert r.status_code == 200, r.text
    assert api.client.post(f"/v1/collections/{cid}/warm", headers=api.b).status_code == 404
    before = smollm_engine.metrics().passages.stored
    r = api.client.post(f"/v1/collections/{cid}/warm", headers=api.a)
    assert r.status_code == 202, r.text
    assert r.json() == {"passages": len(FACTS)}
    deadline = time.monotonic() + 60
    while smollm_engine.metrics().passages.stored < before + len(FACTS):
        assert time.monotonic() < deadline, "the warm-up did not finish"
        time.sleep(0.1)
    body = {"question": "What time does the reading room open?", "k": 3, "max_tokens": 8}
    r = api.client.post(f"/v1/collections/{cid}/ask", json=body, headers=api.a)
    assert r.status_code == 200, r.text
    assert r.json()["answer_source"] == "generated", r.json()
    usage = r.json()["usage"]
    # Passage 1 follows the system prompt exactly as in its warm prompt (a prefix hit); the
    # other two are copied from the cache.
    assert usage["reused_tokens"] > 20 and usage["cached_tokens"] > 0
