"""Blocking work runs on the service's own bounded thread pools, refused early with 429 when
one is full (and one kind of work never takes another's threads); long polls are bounded,
look at the database less and less often, and stop when the client has gone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rag.api.pools import Pools
from rag.config import ApiAdvanced, ApiSettings
from rag.embed import Embedder
from tests.conftest import Api


def _pools(api: Api, max_long_polls: int = 256, **advanced: Any) -> Pools:
    pools = Pools(ApiSettings(max_long_polls=max_long_polls, advanced=ApiAdvanced(**advanced)))
    api.client.app.state.pools = pools  # type: ignore[attr-defined]
    return pools


def test_a_full_search_pool_answers_429_at_once_and_listings_still_run(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    _pools(api, search_threads=1, thread_queue=1)
    release = threading.Event()
    entered = threading.Semaphore(0)
    real = api.services.retriever.search

    def slow(*args: Any, **kwargs: Any) -> Any:
        entered.release()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(api.services.retriever, "search", slow)

    def search() -> Any:
        return api.client.post(f"/v1/collections/{cid}/search", json={"query": "q"}, headers=api.a)

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(search)
        assert entered.acquire(timeout=10)  # one on the search thread
        waiting = pool.submit(search)  # one waiting for it (the queue holds one)
        for _ in range(100):
            if api.client.app.state.pools.search.admitted == 2:  # type: ignore[attr-defined]
                break
            threading.Event().wait(0.02)
        refused = search()
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        # Other work has threads of its own.
        assert api.client.get("/v1/collections", headers=api.a).status_code == 200
        release.set()
        assert running.result(30).status_code == 200
        assert waiting.result(30).status_code == 200
    assert search().status_code == 200


def test_key_lookups_have_their_own_bounded_threads(sqlite_api: Api) -> None:
    api = sqlite_api
    pools = _pools(api, auth_threads=1, thread_queue=0)
    api.services.key_cache.ttl_s = 0  # every request looks its key up
    api.services.key_cache._entries.clear()
    pools.auth.busy = 1  # as if a lookup were running now
    r = api.client.get("/v1/collections", headers=api.a)
    assert r.status_code == 429 and "key lookup" in r.json()["error"]["message"]
    pools.auth.busy = 0
    assert api.client.get("/v1/collections", headers=api.a).status_code == 200


def test_long_polls_are_bounded(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder
) -> None:
    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)  # jobs stay queued
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    pools = _pools(api, max_long_polls=1)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(api.client.get, f"/v1/jobs/{job}", params={"wait": 2}, headers=api.a)
        for _ in range(200):
            if pools.long_polls == 1:
                break
            threading.Event().wait(0.01)
        r = api.client.get(f"/v1/jobs/{job}", params={"wait": 2}, headers=api.a)
        assert r.status_code == 429, r.text
        assert "Retry-After" in r.headers
        # Without `wait` it answers at once.
        assert api.client.get(f"/v1/jobs/{job}", headers=api.a).json()["state"] == "queued"
        assert held.result(30).status_code == 200
    assert pools.long_polls == 0


class _Clock:
    """Stands in for the job watch's `time` and `_sleep`: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        # A real pause lets every task that is ready run first (a waiter whose client has
        # gone leaves); a few turns of the loop stand in for it.
        for _ in range(10):
            await asyncio.sleep(0)


def _clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    from rag.api import jobwatch
    from rag.api.routes import jobs as route

    clock = _Clock()
    monkeypatch.setattr(jobwatch, "_sleep", clock.sleep)
    monkeypatch.setattr(jobwatch, "time", clock)
    monkeypatch.setattr(route, "time", clock)
    return clock


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from rag.db import jobs

    loads: list[str] = []
    real = jobs.get

    def counting(session: Any, tenant_id: str, job_id: str) -> Any:
        loads.append(job_id)
        return real(session, tenant_id, job_id)

    monkeypatch.setattr(jobs, "get", counting)
    return loads


def test_a_long_poll_looks_less_and_less_often(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    clock = _clock(monkeypatch)
    loads = _count_loads(monkeypatch)
    r = api.client.get(f"/v1/jobs/{job}", params={"wait": 60}, headers=api.a)
    assert r.status_code == 200 and r.json()["state"] == "queued"
    every = api.services.settings.api.advanced.long_poll_every_s
    assert clock.pauses[0] == api.services.settings.api.advanced.long_poll_first_s
    steady = clock.pauses[:-1]  # the last one is what was left of the wait
    assert steady == sorted(steady) and max(steady) == every
    # 60 s at most once a second (it was ten times a second: 600 loads).
    assert len(loads) <= 60 / every + 10
    assert api.client.app.state.pools.jobs.watching == 0  # type: ignore[attr-defined]


def test_waiters_on_one_job_share_one_look(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    loads = _count_loads(monkeypatch)
    with ThreadPoolExecutor(8) as pool:
        polls = [
            pool.submit(api.client.get, f"/v1/jobs/{job}", params={"wait": 3}, headers=api.a)
            for _ in range(8)
        ]
        assert [p.result(30).json()["state"] for p in polls] == ["queued"] * 8
    # At most one read each on arrival (waiters that come together share one); the watch
    # looked about once a tick for all of them over 3 s (0.1, 0.15, 0.225, ... 1 s apart:
    # about 8 looks), where each waiter used to look for itself (about 64).
    assert len(loads) <= 8 + 12, len(loads)


def test_a_burst_of_waiters_on_one_job_is_one_read_and_never_refused(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Long polls that arrive together share the first read of their job: 40 at once are
    one read on the database threads, not 40, of which the tenant's line there refused all
    but a few with a 429, each after the full cost of its request on the event loop."""
    import httpx

    from tests.conftest import LiveServer

    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    _pools(api, tenant_queue=2)
    loads = _count_loads(monkeypatch)

    async def burst(url: str) -> list[int]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(headers=api.a, timeout=30, limits=limits) as client:
            polls = [client.get(url, params={"wait": 1}) for _ in range(40)]
            return [r.status_code for r in await asyncio.gather(*polls)]

    with LiveServer(api.client.app) as server:
        statuses = asyncio.run(burst(f"{server.url}/v1/jobs/{job}"))
    assert statuses == [200] * 40
    # A read or two on arrival, then the watch's few looks over the second (0.1, 0.25,
    # 0.475, 0.81 s).
    assert len(loads) <= 8, len(loads)


def test_a_failed_look_is_every_waiters_answer_and_ends_the_watch() -> None:
    """When the watch's look at the job fails (the database is down), each waiter of that
    job gets the error, and the next long poll starts a watch of its own; the same for the
    first read that waiters arriving together share."""
    from dataclasses import dataclass

    from rag.api.jobwatch import JobWatch

    @dataclass
    class Job:
        done: bool = False

    async def never_gone() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    async def main() -> None:
        watch: JobWatch[Job] = JobWatch(first_s=0.01, every_s=0.01)
        looks = 0

        async def failing() -> Job:
            nonlocal looks
            looks += 1
            raise ConnectionError("database gone")

        deadline = time.monotonic() + 30
        waits = [watch.wait(("t", "j"), Job(), failing, deadline, never_gone) for _ in range(3)]
        results = await asyncio.gather(*waits, return_exceptions=True)
        assert [type(r) for r in results] == [ConnectionError] * 3
        assert looks == 1 and watch.watching == 0

        async def done() -> Job:
            return Job(done=True)

        assert (await watch.wait(("t", "j"), Job(), done, deadline, never_gone)).done

        # Waiters that arrive together, before a watch, share one first read and its error.
        looks = 0
        firsts = [watch.first_look(("t", "k"), failing) for _ in range(5)]
        results = await asyncio.gather(*firsts, return_exceptions=True)
        assert [type(r) for r in results] == [ConnectionError] * 5 and looks == 1
        assert (await watch.first_look(("t", "k"), done)).done  # the next one reads again

    asyncio.run(main())


def test_a_waiter_sees_its_job_done_at_the_next_look(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder
) -> None:
    api = make_api(sqlite_url, hash_embedder)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "ingested at once by the worker in this process")
    r = api.client.get(f"/v1/jobs/{job['job_id']}", params={"wait": 30}, headers=api.a)
    assert r.status_code == 200 and r.json()["done"], r.text
    # Another tenant waits on nothing of its own: the same id is not its job.
    r = api.client.get(f"/v1/jobs/{job['job_id']}", params={"wait": 30}, headers=api.b)
    assert r.status_code == 404, r.text


def test_a_long_poll_stops_when_its_client_has_gone(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    clock = _clock(monkeypatch)
    loads = _count_loads(monkeypatch)
    app = api.client.app
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/jobs/{job}",
        "raw_path": f"/v1/jobs/{job}".encode(),
        "query_string": b"wait=600",
        "root_path": "",
        "headers": [(b"authorization", api.a["Authorization"].encode())],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "state": {},
        "app": app,
    }
    portal = api.client.portal  # type: ignore[attr-defined]
    portal.call(app, scope, receive, send)
    assert len(loads) == 1  # the first look, then it saw the client gone
    assert len(clock.pauses) <= 1  # the watch woke at most once, to find nobody waiting


def test_tenants_take_turns_for_busy_threads() -> None:
    from rag.api.pools import Pool, current_tenant
    from rag.errors import Overloaded

    order: list[str] = []
    gate = threading.Event()

    def work(name: str) -> None:
        if name == "a0":
            gate.wait(10)
        order.append(name)

    async def scenario() -> list[str]:
        pool = Pool("search", threads=1, queue=10, tenant_queue=3)

        async def submit(tenant: str, name: str) -> str:
            current_tenant.set(tenant)
            try:
                await pool.run(work, name)
                return "ok"
            except Overloaded:
                return "429"

        tasks = []
        for tenant, name in [("a", "a0"), ("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b0")]:
            tasks.append(asyncio.create_task(submit(tenant, name)))
            await asyncio.sleep(0.01)
        refused = await submit("a", "a4")  # a's line is full; b's is not
        assert refused == "429" and pool.waiting == 4
        gate.set()
        results = await asyncio.gather(*tasks)
        assert pool.busy == 0 and pool.waiting == 0
        return results

    assert asyncio.run(scenario()) == ["ok"] * 5
    # b's one search waited for one of a's, not for all three.
    assert order == ["a0", "a1", "b0", "a2", "a3"]


def test_one_tenant_runs_at_most_its_share_of_the_threads() -> None:
    """Threads free or not, a tenant's requests beyond tenant_threads wait in its line while
    another tenant's run at once; the line moves as its own requests finish."""
    from rag.api.pools import Pool, current_tenant

    running: dict[str, int] = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}
    gates = {name: threading.Event() for name in ("a0", "a1", "a2", "b0")}
    lock = threading.Lock()

    def work(tenant: str, name: str) -> None:
        with lock:
            running[tenant] += 1
            peak[tenant] = max(peak[tenant], running[tenant])
        gates[name].wait(10)
        with lock:
            running[tenant] -= 1

    async def scenario() -> None:
        pool = Pool("search", threads=4, queue=10, tenant_queue=5, tenant_threads=2)

        async def submit(tenant: str, name: str) -> None:
            current_tenant.set(tenant)
            await pool.run(work, tenant, name)

        tasks = [asyncio.create_task(submit("a", n)) for n in ("a0", "a1", "a2")]
        await asyncio.sleep(0.05)
        assert pool.busy == 2 and pool.waiting == 1  # a2 waits though two threads are free
        tasks.append(asyncio.create_task(submit("b", "b0")))
        await asyncio.sleep(0.05)
        assert pool.busy == 3 and running["b"] == 1  # b runs at once
        gates["a0"].set()
        await asyncio.sleep(0.05)
        assert pool.waiting == 0 and running["a"] == 2  # a2 took a0's place
        for gate in gates.values():
            gate.set()
        await asyncio.gather(*tasks)
        assert pool.busy == 0 and pool.waiting == 0 and not pool._running

    asyncio.run(scenario())
    assert peak == {"a": 2, "b": 1}


def test_a_flood_of_invalid_keys_never_holds_up_a_valid_key(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key lookups that miss the cache all waited in one line, made-up keys and valid ones
    alike: a flood of invalid keys made a valid key wait (or 429) behind all of them. Unknown
    keys now have a line of their own, bounded, and never hold every lookup thread."""
    import rag.api.deps

    api = sqlite_api
    pools = _pools(api, auth_threads=2, thread_queue=64, tenant_queue=4)
    assert api.client.get("/v1/collections", headers=api.a).status_code == 200  # seen once
    api.services.key_cache.ttl_s = 0  # every request looks its key up
    api.services.key_cache._entries.clear()
    release = threading.Event()
    real = rag.api.deps.authenticate

    def slow_for_made_up_keys(db: Any, authorization: str | None, cache: Any = None) -> Any:
        if authorization != api.a["Authorization"]:
            release.wait(10)
        return real(db, authorization, cache)

    monkeypatch.setattr(rag.api.deps, "authenticate", slow_for_made_up_keys)

    def made_up(i: int) -> int:
        bad = {"Authorization": f"Bearer rag_made_up_{i:04d}_xxxxxxxxxxxxxxxxxxxxxxxx"}
        return api.client.get("/v1/collections", headers=bad).status_code

    with ThreadPoolExecutor(12) as flood:
        statuses = [flood.submit(made_up, i) for i in range(12)]
        for _ in range(200):
            if pools.auth.admitted >= 5:
                break
            threading.Event().wait(0.02)
        started = time.monotonic()
        r = api.client.get("/v1/collections", headers=api.a)
        waited = time.monotonic() - started
        release.set()
        assert r.status_code == 200, r.text  # not refused
        assert waited < 5, waited  # and not behind them (each holds a thread 10 s)
        answers = sorted(s.result(30) for s in statuses)
    assert set(answers) <= {401, 429} and 401 in answers and 429 in answers


@pytest.mark.parametrize("route", ["ask", "chat"])
def test_asks_retrieve_on_the_search_threads_in_their_tenants_line(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """An ask's retrieval ran in the default executor, outside the tenants' lines and with
    no bound: one tenant's flood of asks held every thread it wanted and was never refused.
    It now runs on the search threads: past its share a tenant's asks wait in its line, past
    the line's bound they get 429, and another tenant's ask runs at once."""
    api = sqlite_api
    cid_a, cid_b = api.collection(api.a), api.collection(api.b)
    pools = _pools(api, search_threads=2, tenant_threads=1, thread_queue=8, tenant_queue=2)
    release = threading.Event()
    lock = threading.Lock()
    running = {cid_a: 0, cid_b: 0}
    peak = dict(running)
    real = api.services.retriever.search

    def slow(tenant_id: str, cid: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            running[cid] += 1
            peak[cid] = max(peak[cid], running[cid])
        try:
            if cid == cid_a:
                release.wait(30)
            return real(tenant_id, cid, *args, **kwargs)
        finally:
            with lock:
                running[cid] -= 1

    monkeypatch.setattr(api.services.retriever, "search", slow)

    def ask(headers: dict[str, str], cid: str) -> int:
        question = "when does the ferry leave?"
        if route == "chat":
            body = {"model": cid, "messages": [{"role": "user", "content": question}]}
            url = "/v1/chat/completions"
        else:
            body, url = {"question": question}, f"/v1/collections/{cid}/ask"
        body["mode"] = "extractive"
        return api.client.post(url, json=body, headers=headers).status_code

    with ThreadPoolExecutor(6) as flood:
        floods = [flood.submit(ask, api.a, cid_a) for _ in range(6)]
        for _ in range(200):
            if sum(f.done() for f in floods) >= 3 or peak[cid_a] >= 6:
                break
            threading.Event().wait(0.02)
        started = time.monotonic()
        assert ask(api.b, cid_b) == 200  # b's ask is not behind a's
        assert time.monotonic() - started < 5
        assert peak[cid_a] == 1  # a's share of the threads
        assert pools.search.waiting == 2  # a's line is full
        release.set()
        statuses = sorted(f.result(30) for f in floods)
    assert statuses == [200, 200, 200, 429, 429, 429], statuses
    assert pools.search.busy == 0 and pools.search.waiting == 0


def test_a_request_that_waits_too_long_in_its_line_is_refused() -> None:
    """A tenant's own backlog (64 connections of long searches) kept its requests waiting
    past its clients' patience: they had no answer at all. Past `wait_s` in line a request
    is refused (429), and the line moves on without it."""
    from rag.api.pools import Pool, current_tenant
    from rag.errors import Overloaded

    gate = threading.Event()

    async def scenario() -> list[str]:
        pool = Pool("search", threads=1, queue=10, tenant_queue=5, wait_s=0.2)

        async def submit(tenant: str) -> str:
            current_tenant.set(tenant)
            try:
                await pool.run(gate.wait, 10)
                return "ok"
            except Overloaded as exc:
                assert "waited" in str(exc)
                return "429"

        first = asyncio.create_task(submit("a"))
        await asyncio.sleep(0.05)
        waited = await submit("a")  # behind the first, longer than wait_s
        assert waited == "429" and pool.waiting == 0
        later = asyncio.create_task(submit("b"))
        await asyncio.sleep(0.05)
        gate.set()
        results = [await first, await later]
        assert pool.busy == 0 and pool.waiting == 0 and not pool._running
        return results

    assert asyncio.run(scenario()) == ["ok", "ok"]


def test_a_long_poll_over_http_ends_when_its_client_gives_up(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder
) -> None:
    """Over a real connection: a client that gives up on its long poll frees its place at
    once (the watch hears the connection close), not when the wait would have ended."""
    import httpx

    from tests.conftest import LiveServer

    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    job = api.upload_text(api.a, cid, "never ingested here")["job_id"]
    pools = api.client.app.state.pools  # type: ignore[attr-defined]
    with LiveServer(api.client.app) as server:
        url = f"{server.url}/v1/jobs/{job}"
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(url, params={"wait": 60}, headers=api.a, timeout=0.5)
        deadline = time.monotonic() + 5
        while (pools.long_polls or pools.jobs.watching) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pools.long_polls == 0 and pools.jobs.watching == 0
