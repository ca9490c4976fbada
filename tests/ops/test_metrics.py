"""/metrics, /healthz, /readyz and request ids through the real app."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from rag.api.app import create_app
from rag.embed import HashEmbedder
from rag.ops.logs import request_id
from rag.ops.metrics import observe_stages
from rag.services import build_services
from tests.conftest import ADMIN, Api, make_settings
from tests.support.fakes import BackendBasics


def _scrape(client: TestClient, headers: dict[str, str] = ADMIN) -> dict[tuple, float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


SEARCH = "/v1/collections/{collection_id}/search"


def test_metrics_parse_and_counters_move(api: Api) -> None:
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    before = _scrape(api.client)
    for _ in range(3):
        r = api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
        assert r.status_code == 200
    r = api.client.post("/v1/collections/nope/search", json={"query": "x"}, headers=api.a)
    assert r.status_code == 404
    after = _scrape(api.client)
    ok = {"method": "POST", "route": SEARCH, "status": "200"}
    assert (
        _value(after, "rag_http_responses_total", **ok)
        - _value(before, "rag_http_responses_total", **ok)
        == 3
    )
    # The route template is the label, never the raw path with its ids.
    assert _value(after, "rag_http_responses_total", method="POST", route=SEARCH, status="404") == 1
    assert not any(cid in str(key) and "http" in key[0] for key in after)
    count = "rag_http_request_duration_seconds_count"
    assert (
        _value(after, count, method="POST", route=SEARCH)
        - _value(before, count, method="POST", route=SEARCH)
        == 4
    )
    # Scrape-time figures from SQL.
    assert _value(after, "rag_ingest_jobs", state="done") == 1
    assert _value(after, "rag_ingest_queue_depth") == 0
    assert _value(after, "rag_chunks_indexed", collection=cid) == 1
    assert _value(after, "rag_metrics_database_up") == 1
    # The engine is never built by a scrape.
    assert not api.services.engine_loaded
    assert not any(key[0].startswith("rag_engine") for key in after)


def test_an_index_that_lost_vectors_shows_in_the_mismatch_gauge(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a, index={"kind": "hnsw"})
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
    index = api.services.indexes.get(cid)
    index.erase(index.ids())
    api.services.indexes.check_counts()
    after = _scrape(api.client)
    assert _value(after, "rag_index_mismatch", collection=cid, kind="hnsw") == 1
    assert len(api.services.indexes.get(cid)) == 1  # repaired
    api.services.indexes.check_counts()
    assert _value(_scrape(api.client), "rag_index_mismatch", collection=cid, kind="hnsw") == 0


def test_unmatched_paths_share_one_label(sqlite_api: Api) -> None:
    api = sqlite_api
    for i in range(3):
        assert api.client.get(f"/no/such/path/{i}").status_code == 404
    after = _scrape(api.client)
    assert (
        _value(after, "rag_http_responses_total", method="GET", route="unmatched", status="404")
        == 3
    )


def test_metrics_needs_an_admin_key_unless_public(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder, tmp_path: Path
) -> None:
    api = make_api(sqlite_url, hash_embedder)
    assert api.client.get("/metrics").status_code == 401
    assert api.client.get("/metrics", headers=api.a).status_code == 403
    assert api.client.get("/metrics", headers=ADMIN).status_code == 200
    # Health and readiness need no key.
    assert api.client.get("/healthz").status_code == 200
    assert api.client.get("/readyz").status_code == 200
    settings = make_settings(tmp_path / "public", None)
    settings.metrics.public = True
    services = build_services(settings, embedder=hash_embedder)
    with TestClient(create_app(settings, services)) as client:
        assert client.get("/metrics").status_code == 200
    settings = make_settings(tmp_path / "off", None)
    settings.metrics.enabled = False
    services = build_services(settings, embedder=hash_embedder)
    with TestClient(create_app(settings, services)) as client:
        assert client.get("/metrics", headers=ADMIN).status_code == 404
        # Metrics off, request ids still on: the logs need them.
        r = client.get("/healthz", headers={"X-Request-ID": "probe-7"})
        assert r.headers["x-request-id"] == "probe-7"
        assert len(client.get("/healthz").headers["x-request-id"]) == 32


def test_stage_timings_and_request_ids(tmp_path: Path, hash_embedder: HashEmbedder) -> None:
    settings = make_settings(tmp_path, None)
    services = build_services(settings, embedder=hash_embedder)
    app = create_app(settings, services)
    probe = APIRouter()

    @probe.get("/probe")
    def _probe() -> dict[str, str]:  # a sync route: runs in the thread pool
        observe_stages("search", {"embed": 3.0, "search": 1.5, "total": 5.0})
        return {"request_id": request_id.get()}

    app.include_router(probe)
    with TestClient(app) as client:
        r = client.get("/probe", headers={"X-Request-ID": "abc-123.x"})
        assert r.headers["x-request-id"] == "abc-123.x"
        assert r.json()["request_id"] == "abc-123.x"
        # Not sane: replaced by a fresh id, which is echoed and seen inside the route.
        r = client.get("/probe", headers={"X-Request-ID": "bad id\twith spaces"})
        fresh = r.headers["x-request-id"]
        assert fresh != "bad id\twith spaces" and len(fresh) == 32
        assert r.json()["request_id"] == fresh
        assert client.get("/probe").headers["x-request-id"] != fresh
        # Errors carry the id too.
        assert "x-request-id" in client.get("/v1/collections", headers={}).headers
        samples = _scrape(client)
    count = "rag_stage_duration_seconds_count"
    assert _value(samples, count, op="search", stage="embed") == 3
    assert _value(samples, count, op="search", stage="search") == 3
    assert _value(samples, count, op="search", stage="total") == 0
    assert _value(
        samples, "rag_stage_duration_seconds_sum", op="search", stage="embed"
    ) == pytest.approx(0.009)
    # The ask path's names: retrieval stages under "retrieve.", decode derived.
    from rag.ops.metrics import Metrics

    metrics = Metrics(lambda: None)
    metrics.observe_stages(
        "ask", {"retrieve.embed": 2.0, "retrieve": 9.0, "first_token": 30.0, "generate": 90.0}
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
    }
    assert _value(samples, count, op="ask", stage="embed") == 1
    assert _value(
        samples, "rag_stage_duration_seconds_sum", op="ask", stage="decode"
    ) == pytest.approx(0.060)
    assert _value(samples, count, op="ask", stage="retrieve") == 0
    # Outside a request it is a no-op.
    observe_stages("search", {"embed": 1.0})


class _FakeEngine(BackendBasics):
    def metrics(self):  # type: ignore[no-untyped-def]
        from rag.engine.passages import PassageStats
        from rag.engine.protocol import EngineMetrics

        return EngineMetrics(
            running=2,
            waiting=3,
            kv_blocks_used=10,
            kv_blocks_free=90,
            kv_blocks_total=100,
            prefix_cache_hit_rate=0.25,
            preemptions=4,
            steps=50,
            tokens_per_step=12.5,
            generated_tokens=600,
            passages=PassageStats(
                hits=7,
                misses=3,
                evictions=1,
                reused_tokens=900,
                recomputed_tokens=40,
                entries=9,
                bytes=4096,
            ),  # fmt: skip
        )


def test_engine_figures_once_loaded(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder
) -> None:
    api = make_api(sqlite_url, hash_embedder, engine=_FakeEngine())
    assert api.client.get("/readyz").json()["checks"]["generator"]["loaded"] is True
    samples = _scrape(api.client)
    assert _value(samples, "rag_engine_sequences", state="running") == 2
    assert _value(samples, "rag_engine_sequences", state="waiting") == 3
    assert _value(samples, "rag_engine_kv_blocks", state="used") == 10
    assert _value(samples, "rag_engine_kv_blocks", state="free") == 90
    assert _value(samples, "rag_engine_prefix_cache_hit_rate") == 0.25
    assert _value(samples, "rag_engine_preemptions_total") == 4
    assert _value(samples, "rag_engine_tokens_per_step") == 12.5
    assert _value(samples, "rag_engine_passage_cache_lookups_total", result="hit") == 7
    assert _value(samples, "rag_engine_passage_cache_lookups_total", result="miss") == 3
    assert _value(samples, "rag_engine_passage_cache_evictions_total") == 1
    assert _value(samples, "rag_engine_passage_tokens_total", how="reused") == 900
    assert _value(samples, "rag_engine_passage_tokens_total", how="recomputed") == 40
    assert _value(samples, "rag_engine_passage_cache_entries") == 9
    assert _value(samples, "rag_engine_passage_cache_bytes") == 4096


def test_readyz_ready_then_database_gone(
    make_api: Callable[..., Api], db_url: str, hash_embedder: HashEmbedder
) -> None:
    api = make_api(db_url, hash_embedder, sections={"metrics": {"readyz_cache_s": 0}})
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
    r = api.client.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"]["ok"] and body["checks"]["embedder"]["ok"]
    assert body["checks"]["indexes"] == {"ok": True, "open": 1}
    # The generator (not loaded at start in tests) is reported, not required.
    assert body["checks"]["generator"] == {"ok": True, "loaded": False, "loading": False}
    # Point the services at a database that is not there.
    from rag.db import Database

    good = api.services.db
    if good.is_sqlite:
        bad = Database(f"sqlite:///{Path(str(good.url.database)).parent / 'gone' / 'x.db'}")
        Path(str(bad.url.database)).parent.rmdir()
    else:
        bad = Database("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    api.services.db = bad
    try:
        r = api.client.get("/readyz")
    finally:
        api.services.db = good
        bad.dispose()
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not ready"
    assert body["checks"]["database"]["ok"] is False
    assert "unreachable" in body["checks"]["database"]["error"]
    assert api.client.get("/healthz").status_code == 200


def test_search_ask_and_chat_record_their_stages(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder
) -> None:
    from tests.ops.conftest import RecordingEngine

    api = make_api(sqlite_url, hash_embedder, engine=RecordingEngine())
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    question = "when does the ferry leave from pier four"
    before = _scrape(api.client)
    for body in ({"query": question}, {"query": question, "hybrid": 0.5}):
        r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=api.a)
        assert r.status_code == 200, r.text
    r = api.client.post(f"/v1/collections/{cid}/ask", json={"question": question}, headers=api.a)
    assert r.status_code == 200 and r.json()["finish_reason"] == "stop", r.text
    r = api.client.post(
        "/v1/chat/completions",
        json={"model": cid, "messages": [{"role": "user", "content": question}]},
        headers=api.a,
    )
    assert r.status_code == 200, r.text
    after = _scrape(api.client)
    count = "rag_stage_duration_seconds_count"

    def moved(op: str, stage: str) -> float:
        return _value(after, count, op=op, stage=stage) - _value(before, count, op=op, stage=stage)

    # Both searches embed, search and hydrate; only the hybrid one has a keyword side.
    for stage in ("embed", "search", "hydrate", "fuse"):
        assert moved("search", stage) == 2, stage
    assert moved("search", "keyword") == 1
    for op in ("ask", "chat"):
        for stage in (
            "embed", "search", "hydrate", "prompt", "queue", "prefill", "first_token", "decode",
            "cite",
        ):  # fmt: skip
            assert moved(op, stage) == 1, (op, stage)
    # "total" is the request histogram's business.
    assert not any(k[0] == count and ("stage", "total") in k[1] for k in after)


def test_readyz_names_an_index_that_has_fallen_behind(
    make_api: Callable[..., Api], db_url: str, hash_embedder: HashEmbedder, tmp_path: Path
) -> None:
    from rag.api.routes.ops import BEHIND_AFTER_S, readiness

    api = make_api(db_url, hash_embedder)
    cid = api.collection(api.a)
    first = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    assert api.wait_job(api.a, first["job_id"])["state"] == "done"
    # A second replica on the same database, not started: no background catch-up, so its
    # index stays where it was opened while the first one ingests more.
    settings = make_settings(tmp_path / "replica", api.services.settings.database_url)
    replica = build_services(settings, embedder=hash_embedder, in_process_worker=False)
    try:
        replica.indexes.get(cid)
        assert readiness(replica)["indexes"] == {"ok": True, "open": 1}
        for text in ("Tide tables are printed monthly.", "Storm warnings on channel 16."):
            item = api.upload_text(api.a, cid, text)
            assert api.wait_job(api.a, item["job_id"])["state"] == "done"
        # Behind while catch-ups keep finishing (an upload burst) is not a reason to leave
        # the load balancer: it counts once none has finished for a while. Known without a
        # query: a probe from anyone costs none per index.
        live = dict(replica.indexes.lives())[cid]
        assert readiness(replica)["indexes"]["ok"] is True
        live.caught_up_at = time.monotonic() - BEHIND_AFTER_S - 1
        checks = readiness(replica)
        assert checks["indexes"]["ok"] is False
        assert checks["indexes"]["behind"] == 1  # counted: probes carry no key, ids stay out
        assert cid not in str(checks)
        assert checks["database"]["ok"] and checks["embedder"]["ok"]
        replica.indexes.catch_up(cid)
        assert readiness(replica)["indexes"] == {"ok": True, "open": 1}
    finally:
        replica.close()


def test_a_rebuild_keeps_the_replica_ready_and_readyz_names_no_collection(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: HashEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    api = make_api(sqlite_url, hash_embedder)
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
    release = threading.Event()
    source = api.services.indexes.source
    real = source.build

    def slow(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(source, "build", slow)
    try:
        r = api.client.post(f"/v1/collections/{cid}/index/rebuild", json={}, headers=api.a)
        assert r.status_code == 202 and r.json()["building"] is True, r.text
        r = api.client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"]["indexes"] == {"ok": True, "open": 1, "rebuilding": 1}
        assert cid not in r.text
    finally:
        release.set()


def test_readyz_reports_a_dead_step_thread_and_is_cheap(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder
) -> None:
    """Issue 31: /readyz said generator ok whatever the step thread did, and ran a query per
    open index for anyone."""
    from sqlalchemy import event

    engine = _FakeEngine()
    api = make_api(
        sqlite_url, hash_embedder, engine=engine, sections={"metrics": {"readyz_cache_s": 0}}
    )
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(api.services.db.engine, "before_cursor_execute", record)
    try:
        assert api.client.get("/readyz").status_code == 200
        engine.alive = False  # type: ignore[attr-defined]
        r = api.client.get("/readyz")
    finally:
        event.remove(api.services.db.engine, "before_cursor_execute", record)
    assert r.status_code == 503
    assert r.json()["checks"]["generator"]["ok"] is False
    assert "step thread" in r.json()["checks"]["generator"]["error"]
    assert not any("change_log" in s for s in statements)  # the ping only
    # Cached: a burst of probes within readyz_cache_s costs one check.
    api.services.settings.metrics.readyz_cache_s = 60.0
    engine.alive = True  # type: ignore[attr-defined]
    assert api.client.get("/readyz").status_code == 503


def test_a_burst_of_probes_runs_one_readiness_check(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes that found no fresh answer each ran the check, on one of the 40 threads of
    FastAPI's pool: a flood of /readyz (anyone may send it) ran the database ping as often
    as it came and waited for threads. One check now runs at a time, the probes that come
    meanwhile share its answer, and a cached answer is given on the event loop."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rag.api.routes import ops

    api = sqlite_api
    api.services.settings.metrics.readyz_cache_s = 60.0
    calls: list[int] = []
    real = ops.readiness

    def slow(services: Any) -> Any:
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return real(services)

    monkeypatch.setattr(ops, "readiness", slow)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: api.client.get("/readyz").status_code, range(8)))
    assert statuses == [200] * 8
    assert len(calls) == 1


def test_readyz_keeps_an_index_being_caught_up_in_service(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: HashEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Under a flood of long searches the catch-up waits for the index; a search that gave up
    waiting for it marks the index stale, and /readyz answered 503: one tenant's searches
    took the replica out. An index a catch-up holds, or caught up within BEHIND_AFTER_S, is
    ready; one nobody catches up, stale past that, is not."""
    import time

    from rag.api.routes.ops import BEHIND_AFTER_S

    api = make_api(sqlite_url, hash_embedder, sections={"metrics": {"readyz_cache_s": 0}})
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a)
    (_, live), = list(api.services.indexes.lives())  # fmt: skip

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the change log is unreadable")

    monkeypatch.setattr(api.services.indexes.source, "apply_changes", broken)
    with live.lock:  # the catch-up loop holds it
        live.stale = True
        live.caught_up_at = time.monotonic() - 2 * BEHIND_AFTER_S
        assert api.client.get("/readyz").status_code == 200
    r = api.client.get("/readyz")  # nobody catches it up, and the last catch-up failed
    assert r.status_code == 503 and r.json()["checks"]["indexes"]["stale"] == 1
    live.caught_up_at = time.monotonic()  # it failed just now: still within the bound
    assert api.client.get("/readyz").status_code == 200
