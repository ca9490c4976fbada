"""Quality fixtures: the ask tests' fake generator, and apps whose answers are recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.answer.conftest import FakeEngine, ingest, live_api  # noqa: F401  (a fixture)
from tests.conftest import Api

FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
    "The fish market opens before dawn and closes at noon on Sundays.",
]
# Answers of the fake generator cite [1]; evidence "all" streams them as written.
ASK = {"question": "What time does the ferry leave?", "evidence": "all", "k": 2}


def quality_api(make_api: Callable[..., Api], db_url: str, embedder: Any, **quality: object) -> Api:
    """An app with a fake generator whose answers are all recorded."""
    api = make_api(
        db_url,
        embedder,
        engine=FakeEngine(),
        sections={"quality": quality, "ask": {"relevance_threshold": -1.0}},
    )
    return api


def flush(api: Api) -> None:
    assert api.services.quality is not None
    api.services.quality.recorder.flush()


@pytest.fixture
def qapi(make_api: Callable[..., Api], db_url: str, hash_embedder: Any) -> Api:
    return quality_api(make_api, db_url, hash_embedder)
