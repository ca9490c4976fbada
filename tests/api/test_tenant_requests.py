"""One tenant holds at most `api.tenant_requests` requests in the service at once: the next
is answered 429 before it is read, and other tenants are not counted with it; past a
second's burst, a tenant's 429s wait their turn, and so do requests without a key from one
address. Every route parses its JSON body with orjson (rag.api.body)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi.routing import APIRoute

from rag.api.body import JsonRoute
from rag.api.limits import Pace, TenantRequests
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


def test_refusals_past_a_seconds_burst_wait_their_turn() -> None:
    now = [0.0]
    pace = Pace(4.0, clock=lambda: now[0])
    assert [pace.delay("a") for _ in range(4)] == [0.0] * 4  # a second's worth at once
    assert [round(pace.delay("a"), 6) for _ in range(3)] == [0.25, 0.5, 0.75]
    assert pace.delay("b") == 0.0  # another tenant's refusals keep their own turns
    now[0] = 2.0  # a's waits are over, and its burst is back after a quiet second
    assert round(pace.delay("a"), 6) == 0.0
    now[0] = 10.0
    assert [pace.delay("a") for _ in range(4)] == [0.0] * 4
    assert round(pace.delay("a"), 6) == 0.25


def test_a_pace_forgets_keys_whose_requests_have_gone_on() -> None:
    now = [0.0]
    pace = Pace(10.0, clock=lambda: now[0])
    for i in range(Pace.MAX_KEYS):
        pace.delay(f"address {i}")
    assert len(pace._due) == Pace.MAX_KEYS  # kept up to the bound
    now[0] = 5.0  # every one's turn has passed
    assert pace.delay("a new address") == 0.0  # past the bound: the others are dropped
    assert set(pace._due) == {"a new address"}


def test_a_tenants_refusals_are_paced_and_anothers_are_not(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder
) -> None:
    # One long-poll place: every other long poll is refused inside the service (429), for
    # tenant a at most two a second after its burst of two.
    api = make_api(
        sqlite_url, hash_embedder, in_process_worker=False,
        sections={"api": {"max_long_polls": 1, "advanced": {"refusals_per_s": 2}}},
    )  # fmt: skip
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    other = api.collection(api.b)
    other_job = api.upload_text(api.b, other, "nor here")["job_id"]
    limiter = _limiter(api)
    poll = f"/v1/jobs/{job}"
    with ThreadPoolExecutor(8) as pool:
        held = pool.submit(api.client.get, poll, params={"wait": 4}, headers=api.a)
        for _ in range(500):
            if api.client.app.state.pools.long_polls == 1:  # type: ignore[attr-defined]
                break
            threading.Event().wait(0.01)
        t0 = time.monotonic()
        refused = [
            pool.submit(api.client.get, poll, params={"wait": 4}, headers=api.a) for _ in range(5)
        ]
        # The first two at once, then one every half second: the fifth at 1.5 s. Another
        # tenant's refusal meanwhile is answered at once, in its own turn.
        r = api.client.get(f"/v1/jobs/{other_job}", params={"wait": 4}, headers=api.b)
        assert r.status_code == 429, r.text
        assert not all(f.done() for f in refused)
        statuses = [f.result(30).status_code for f in refused]
        waited = time.monotonic() - t0
        assert statuses == [429] * 5
        assert waited >= 1.45, waited  # (never sooner: each waits its turn on a timer)
        assert held.result(30).status_code == 200
    assert limiter.running == {}


def test_requests_without_a_key_are_paced_by_address() -> None:
    answered: list[tuple[str, float]] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        answered.append((scope["client"][0], time.monotonic()))

    door = TenantRequests(app, limit=64, key_cache=lambda: None, probes_per_s=2)

    async def probe(address: str) -> None:
        scope = {"type": "http", "path": "/readyz", "method": "GET", "headers": [],
                 "client": (address, 40000)}  # fmt: skip
        await door(scope, None, None)  # type: ignore[arg-type]

    async def flood() -> float:
        t0 = time.monotonic()
        flooder = [asyncio.create_task(probe("10.0.0.1")) for _ in range(5)]
        await asyncio.sleep(0.1)
        await probe("10.0.0.2")  # another address: its own turn, at once
        await asyncio.gather(*flooder)
        return t0

    t0 = asyncio.run(flood())
    order = [address for address, _ in answered]
    # Two at once (a second's burst), then one every half second; the other address's
    # request went in before the third.
    assert order == ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1", "10.0.0.1"]
    assert answered[-1][1] - t0 >= 1.45  # (never sooner: each waits its turn on a timer)


def test_every_route_parses_json_with_orjson(sqlite_api: Api) -> None:
    app = sqlite_api.client.app  # type: ignore[attr-defined]
    routes: list[APIRoute] = []
    for entry in app.routes:  # FastAPI's own pages, and the routers included
        router = getattr(entry, "original_router", None)
        assert router is not None or not isinstance(entry, APIRoute), entry
        routes += [r for r in getattr(router, "routes", []) if isinstance(r, APIRoute)]
    assert len(routes) > 20
    assert [r.path for r in routes if not isinstance(r, JsonRoute)] == []
