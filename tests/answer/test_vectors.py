"""The evidence step's unit vectors, kept per tenant (rag.answer.vectors): a text embedded once
is not embedded again for the same tenant, is for another, and every kept vector goes when the
purge erases a document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rag.answer.vectors import UnitVectors
from rag.embed.fake import HashEmbedder
from tests.answer.conftest import FakeEngine, ingest
from tests.conftest import Api


def test_a_text_is_embedded_once_per_tenant_and_the_oldest_leave_first() -> None:
    model = HashEmbedder(384)
    cache = UnitVectors(capacity=3)
    embed_a = cache.embed("tenant-a", model.embed)
    first = embed_a(["the question", "unit one", "unit two"])
    assert model.calls == [3]
    again = embed_a(["another question", "unit two", "unit one"])
    assert model.calls == [3, 1]  # only the new question
    assert np.allclose(again[1], first[2]) and np.allclose(again[2], first[1])
    assert np.allclose(again, model.embed(["another question", "unit two", "unit one"]))
    # Another tenant finds nothing of a's, though the texts are the same.
    cache.embed("tenant-b", model.embed)(["unit one"])
    assert model.calls[-1] == 1 and len(cache) == 3
    # Capacity 3: the least recently used left first ("the question", then "unit two").
    model.calls.clear()
    embed_a(["unit one", "another question"])
    assert model.calls == []
    embed_a(["unit one", "the question", "unit two"])
    assert model.calls == [2]
    assert embed_a([]).shape == (0, 384) and model.calls[-1] == 0  # nothing to look up
    cache.clear()
    assert len(cache) == 0


FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
]


@pytest.mark.slow
def test_a_seen_passage_is_not_embedded_again_and_a_purge_empties_the_cache(
    make_api: Callable[..., Api], sqlite_url: str, minilm: Any
) -> None:
    api = make_api(sqlite_url, minilm, engine=FakeEngine())
    kept = api.services.unit_vectors
    cid_a = api.collection(api.a)
    docs = ingest(api, api.a, cid_a, FACTS)
    body = {"question": "Which pier does the ferry to the island leave from?", "mode": "extractive"}
    first = api.client.post(f"/v1/collections/{cid_a}/ask", json=body, headers=api.a).json()
    assert first["answer_source"] == "quoted" and "pier four" in first["answer"]
    size = len(kept)
    assert size > 0
    second = api.client.post(f"/v1/collections/{cid_a}/ask", json=body, headers=api.a).json()
    assert second["answer"] == first["answer"] and len(kept) == size  # nothing new embedded
    # The same passages in another tenant's collection are embedded for that tenant.
    cid_b = api.collection(api.b)
    ingest(api, api.b, cid_b, FACTS)
    third = api.client.post(f"/v1/collections/{cid_b}/ask", json=body, headers=api.b).json()
    assert third["answer"] == first["answer"] and len(kept) > size
    # A deleted document's vectors leave with the purge.
    assert api.client.delete(f"/v1/documents/{docs[0]}", headers=api.a).status_code == 204
    api.services.purger.run_once()
    assert len(kept) == 0
