"""The generator loads in the background as the API starts: /readyz stays 200 and says it is
loading, the first question waits for the same build, and a delete reaches the engine."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from rag.embed import HashEmbedder
from rag.engine import build
from tests.conftest import Api
from tests.support.fakes import BackendBasics


class _Loaded(BackendBasics):
    pass


def test_the_generator_loads_in_the_background_at_start(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: HashEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    built: list[_Loaded] = []

    def slow_build(settings: object) -> _Loaded:
        release.wait(10)
        built.append(_Loaded())
        return built[-1]

    monkeypatch.setattr(build, "build_engine", slow_build)
    api = make_api(
        sqlite_url,
        hash_embedder,
        sections={"engine": {"load_at_start": True}, "metrics": {"readyz_cache_s": 0}},
    )
    r = api.client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["generator"] == {"ok": True, "loaded": False, "loading": True}
    release.set()
    for _ in range(200):
        if api.services.engine_loaded:
            break
        threading.Event().wait(0.02)
    gen = api.client.get("/readyz").json()["checks"]["generator"]
    assert gen == {"ok": True, "loaded": True, "loading": False}
    assert api.services.engine is built[0] and len(built) == 1  # built once


def test_a_deleted_documents_chunks_reach_the_engine(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder
) -> None:
    engine = _Loaded()
    api = make_api(
        sqlite_url, hash_embedder, engine=engine, sections={"purge": {"interval_s": 0.1}}
    )
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    from sqlalchemy import select

    from rag.db.models import Chunk

    with api.services.db.read() as s:  # the row ids (clients see opaque ones)
        ids = set(s.scalars(select(Chunk.id).where(Chunk.document_id == item["document_id"])))
    assert ids
    r = api.client.delete(f"/v1/documents/{item['document_id']}", headers=api.a)
    assert r.status_code == 204, r.text
    for _ in range(300):
        if ids <= getattr(engine, "dropped", set()):
            break
        threading.Event().wait(0.02)
    assert ids <= engine.dropped  # type: ignore[attr-defined]
