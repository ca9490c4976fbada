"""One tenant holds at most `api.tenant_requests` requests in the service at once: the next
is answered 429 before it is read, and other tenants are not counted with it. Every route
parses its JSON body with orjson (rag.api.body)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi.routing import APIRoute

from rag.api.body import JsonRoute
from rag.api.limits import TenantRequests
from rag.embed import Embedder
from tests.conftest import Api


def _limiter(api: Api) -> TenantRequests:
    app = api.client.app  # type: ignore[attr-defined]
    layer = app.middleware_stack
    while not isinstance(layer, TenantRequests):
        layer = layer.app
    return layer


def test_a_tenant_past_its_requests_in_progress_gets_429_unread(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder
) -> None:
    api = make_api(
        sqlite_url, hash_embedder, sections={"api": {"tenant_requests": 2}},
        in_process_worker=False,
    )  # fmt: skip
    # Every request checks its key in the database (no cached principal): the tenant is still
    # known from the key's first resolution, so a burst is counted before any key check ends.
    api.services.key_cache.ttl_s = 0
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    other = api.collection(api.b)
    limiter = _limiter(api)
    poll = {"params": {"wait": 3}, "headers": api.a}
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(api.client.get, f"/v1/jobs/{job}", **poll) for _ in range(2)]
        for _ in range(500):
            if sum(limiter.running.values()) == 2:
                break
            threading.Event().wait(0.01)
        assert list(limiter.running.values()) == [2]
        r = api.client.post(f"/v1/collections/{cid}/search", json={"query": "x"}, headers=api.a)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "overloaded"
        assert r.headers["Retry-After"] == "1"
        assert r.headers["connection"] == "close"  # its body was never read
        # Another tenant is not held back by it.
        r = api.client.post(f"/v1/collections/{other}/search", json={"query": "x"}, headers=api.b)
        assert r.status_code == 200, r.text
        assert [h.result(30).status_code for h in held] == [200, 200]
    assert limiter.running == {}
    r = api.client.post(f"/v1/collections/{cid}/search", json={"query": "x"}, headers=api.a)
    assert r.status_code == 200, r.text


def test_every_route_parses_json_with_orjson(sqlite_api: Api) -> None:
    app = sqlite_api.client.app  # type: ignore[attr-defined]
    routes: list[APIRoute] = []
    for entry in app.routes:  # FastAPI's own pages, and the routers included
        router = getattr(entry, "original_router", None)
        assert router is not None or not isinstance(entry, APIRoute), entry
        routes += [r for r in getattr(router, "routes", []) if isinstance(r, APIRoute)]
    assert len(routes) > 20
    assert [r.path for r in routes if not isinstance(r, JsonRoute)] == []
