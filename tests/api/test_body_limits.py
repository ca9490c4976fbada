"""Bodies are bounded per route while they stream in, a body without a key is never read, the
upload's JSON is parsed off the event loop, and a 422 stays small whatever the body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from rag.api.limits import BodyLimit, path_pattern
from tests.conftest import Api


def test_json_routes_take_small_bodies_the_upload_a_large_one(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    big = {"query": "x", "filter": {"document_ids": ["d" * 32] * 40_000}}  # ~1.5 MB
    r = api.client.post(f"/v1/collections/{cid}/search", json=big, headers=api.a)
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"]["code"] == "too_large"
    # The same size streamed without a Content-Length is cut off as it arrives.
    payload = json.dumps(big).encode()

    def chunks() -> Any:
        for at in range(0, len(payload), 65536):
            yield payload[at : at + 65536]

    r = api.client.post(
        f"/v1/collections/{cid}/search",
        content=chunks(),
        headers={**api.a, "content-type": "application/json"},
    )
    assert r.status_code == 413, r.text[:200]
    # The upload route takes up to the upload limit.
    text = "ferry schedules and tide tables " * 100_000  # 3.2 MB
    r = api.client.post(f"/v1/collections/{cid}/documents", json={"text": text}, headers=api.a)
    assert r.status_code == 202, r.text[:200]


def test_a_body_without_a_key_is_refused_before_it_is_read() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append("app")

    async def receive() -> dict[str, Any]:
        reached.append("receive")
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = BodyLimit(app, max_bytes=1 << 20)
    for headers in ([], [(b"authorization", b"Basic abc")], [(b"authorization", b"Bearer ")]):
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/collections/c/search",
            "headers": [(b"content-length", b"50000000"), *headers],
        }
        sent.clear()
        asyncio.run(guard(scope, receive, send))
        assert sent[0]["status"] == 401
        assert (b"www-authenticate", b"Bearer") in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["error"]["code"] == "unauthorized"
    assert reached == []


def test_the_upload_limit_applies_to_the_upload_route_only() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    guard = BodyLimit(
        app,
        max_bytes=1000,
        larger=[("POST", path_pattern("/v1/collections/{collection_id}/documents"), 10**6)],
    )
    assert guard.limit("POST", "/v1/collections/abc/documents") == 10**6
    assert guard.limit("POST", "/v1/collections/abc/search") == 1000
    assert guard.limit("POST", "/v1/collections/abc/documents/x") == 1000
    assert guard.limit("PUT", "/v1/collections/abc/documents") == 1000


def test_the_upload_json_is_parsed_off_the_event_loop(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag.api.routes import documents

    real = documents._read_json
    on_loop: list[bool] = []

    def recording(raw: bytes, limit: int) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(raw, limit)

    monkeypatch.setattr(documents, "_read_json", recording)
    api = sqlite_api
    cid = api.collection(api.a)
    api.upload_text(api.a, cid, "parsed on a worker thread")
    assert on_loop == [False]


def test_a_422_says_how_many_problems_and_shows_a_few(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    # Many problems: at most 10 shown, each part clipped, and how many there were.
    body = {"query": "", "k": 0, "filter": {"document_ids": ["d" * 500] * 1500}}
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=api.a)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid"
    assert "more problems" in error["message"]
    assert len(error["detail"]) == 10
    assert all(len(str(part)) <= 203 for p in error["detail"] for part in p["loc"])
    assert len(r.content) < 8000
    # Made-up keys by the thousand: one problem that says how many, not one per key.
    body = {"query": "x", **{f"unknown{i}-" + "k" * 500: i for i in range(1500)}}
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=api.a)
    assert r.status_code == 422
    error = r.json()["error"]
    assert "1500 unknown fields" in error["message"] and len(error["detail"]) == 1
    assert len(r.content) < 2000
    # A few are named one by one.
    r = api.client.post(
        f"/v1/collections/{cid}/search", json={"query": "x", "colour": 1}, headers=api.a
    )
    assert r.status_code == 422 and r.json()["error"]["detail"][0]["loc"] == ["body", "colour"]
