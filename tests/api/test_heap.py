"""A serving process keeps its start-up objects out of later full garbage collections
(rag.heap): `rag serve` builds its app with `freeze_heap`; other apps (tests, embedders of the
API) leave the collector alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag.api.app import create_app
from rag.embed.fake import HashEmbedder
from rag.services import build_services
from tests.conftest import make_settings


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # what this test froze goes back to the collector


def serve(tmp_path: Path, *, freeze_heap: bool) -> tuple[int, bool]:
    settings = make_settings(tmp_path, sections={"engine": {"load_at_start": False}})
    services = build_services(settings, embedder=HashEmbedder())
    app = create_app(settings, services, freeze_heap=freeze_heap)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        # An object made while serving is still the collector's: a cycle of them is freed.
        cycle: list[object] = []
        cycle.append(cycle)
        frozen = gc.get_freeze_count()
        del cycle
        freed = gc.collect() > 0
    return frozen, freed


def test_a_serving_app_freezes_what_start_up_left_alive(tmp_path: Path, unfrozen: None) -> None:
    frozen, freed = serve(tmp_path, freeze_heap=True)
    assert frozen > 10_000  # the modules, settings, embedder and services alive at start-up
    assert freed


def test_an_app_built_without_it_leaves_the_collector_alone(tmp_path: Path, unfrozen: None) -> None:
    frozen, freed = serve(tmp_path, freeze_heap=False)
    assert frozen == 0
    assert freed
