"""Every endpoint but health needs a key; another tenant's ids answer 404, never 403."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from rag.embed import Embedder
from tests.conftest import ADMIN, Api


def test_health_needs_no_key(api: Api) -> None:
    assert api.client.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer "},
    ],
)
def test_missing_or_bad_key_is_401(api: Api, headers: dict[str, str]) -> None:
    r = api.client.get("/v1/collections", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"


def test_every_route_but_health_needs_a_key(api: Api) -> None:
    for route in api.client.app.routes:  # type: ignore[attr-defined]
        path = getattr(route, "path", "")
        if not path.startswith("/v1"):
            continue
        for method in route.methods - {"HEAD"}:
            url = path.replace("{collection_id}", "x").replace("{document_id}", "x")
            url = url.replace("{job_id}", "x")
            r = api.client.request(method, url)
            assert r.status_code == 401, (method, url, r.status_code)


def test_other_tenants_ids_answer_404(api: Api) -> None:
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "tenant a's private text")
    api.wait_job(api.a, item["job_id"])
    doc, job = item["document_id"], item["job_id"]
    b = api.b
    c = api.client
    checks = [
        c.get(f"/v1/collections/{cid}", headers=b),
        c.delete(f"/v1/collections/{cid}", headers=b),
        c.get(f"/v1/collections/{cid}/documents", headers=b),
        c.post(f"/v1/collections/{cid}/documents", json={"text": "intrusion"}, headers=b),
        c.get(f"/v1/documents/{doc}", headers=b),
        c.get(f"/v1/documents/{doc}/chunks", headers=b),
        c.delete(f"/v1/documents/{doc}", headers=b),
        c.get(f"/v1/jobs/{job}", headers=b),
    ]
    for r in checks:
        assert r.status_code == 404, (r.request.method, r.request.url, r.text)
        assert r.json()["error"]["code"] == "not_found"
    # Tenant b sees no collections, and tenant a's data is untouched.
    assert c.get("/v1/collections", headers=b).json()["collections"] == []
    assert c.get(f"/v1/documents/{doc}", headers=api.a).json()["status"] == "indexed"
    # The same name is free for another tenant.
    assert api.collection(b, name="docs") != cid


def test_keys_are_admin_only(api: Api) -> None:
    r = api.client.post("/v1/keys", json={"tenant": "new"}, headers=api.a)
    assert r.status_code == 403
    r = api.client.post("/v1/keys", json={"tenant": "new"}, headers=ADMIN)
    assert r.status_code == 201
    key = r.json()["key"]
    me = api.client.get("/v1/keys/me", headers={"Authorization": f"Bearer {key}"}).json()
    assert me["tenant_id"] == r.json()["tenant_id"] and key.startswith(me["prefix"])
    assert "key" not in me


def test_only_the_hash_is_stored(api: Api) -> None:
    from sqlalchemy import select

    from rag.db.models import ApiKey

    r = api.client.post("/v1/keys", json={"tenant": "hashcheck"}, headers=ADMIN)
    key = r.json()["key"]
    with api.services.db.read() as s:
        stored = [k.key_hash for k in s.scalars(select(ApiKey))]
    assert key not in stored and all(len(h) == 64 for h in stored)


def _new_key(api: Api, tenant: str) -> tuple[dict[str, str], str]:
    r = api.client.post("/v1/keys", json={"tenant": tenant}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}, r.json()["id"]


def test_a_revoked_key_stops_working_at_once(api: Api) -> None:
    c = api.client
    key, key_id = _new_key(api, "leaving")
    assert c.get("/v1/keys/me", headers=key).json()["id"] == key_id  # resolved, now cached
    assert c.delete(f"/v1/keys/{key_id}", headers=api.a).status_code == 403
    assert c.delete(f"/v1/keys/{key_id}", headers=ADMIN).status_code == 204
    r = c.get("/v1/collections", headers=key)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    # Nor is its tenant remembered for counting its requests (rag.api.limits).
    assert api.services.key_cache.tenant_of(key["Authorization"]) is None
    # Listed as revoked; revoking it again, or an unknown id, is a 404.
    listed = {k["id"]: k for k in c.get("/v1/keys", headers=ADMIN).json()}
    assert listed[key_id]["revoked_at"] is not None
    assert c.get("/v1/keys", headers=api.a).status_code == 403
    assert c.delete(f"/v1/keys/{key_id}", headers=ADMIN).status_code == 404
    assert c.delete("/v1/keys/no-such-key", headers=ADMIN).status_code == 404
    # An admin cannot lock itself out with the key it is using.
    admin_id = c.get("/v1/keys/me", headers=ADMIN).json()["id"]
    r = c.delete(f"/v1/keys/{admin_id}", headers=ADMIN)
    assert r.status_code == 409 and "another admin key" in r.json()["error"]["message"]


def test_a_key_revoked_on_another_replica_stops_within_the_cache_time(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Embedder
) -> None:
    one = make_api(db_url, hash_embedder)
    two = make_api(db_url, hash_embedder)  # a second replica on the same database
    two.services.key_cache.ttl_s = 0.5
    key, key_id = _new_key(one, "roaming")
    assert two.client.get("/v1/collections", headers=key).status_code == 200  # cached there
    assert one.client.delete(f"/v1/keys/{key_id}", headers=ADMIN).status_code == 204
    assert one.client.get("/v1/collections", headers=key).status_code == 401
    time.sleep(0.7)  # past the second replica's cache time
    assert two.client.get("/v1/collections", headers=key).status_code == 401


def test_wrong_keys_are_not_cached(api: Api) -> None:
    for i in range(50):
        headers = {"Authorization": f"Bearer made-up-{i}"}
        assert api.client.get("/v1/collections", headers=headers).status_code == 401
    assert api.client.get("/v1/collections", headers=api.a).status_code == 200
    assert len(api.services.key_cache._entries) <= 3  # tenant a's, and the admin's


def test_models_lists_collections_by_name_unless_the_name_is_taken(sqlite_api: Api) -> None:
    """What clients such as the `openai` library show is the model id: a collection is listed
    under its name, and under its id where the name means something else here."""
    api = sqlite_api
    harbour = api.collection(api.a, name="harbour")
    clash = api.collection(api.a, name="smollm2")  # the generator's own model name
    data = api.client.get("/v1/models", headers=api.a).json()["data"]
    listed = {m["collection_id"]: m["id"] for m in data if m["kind"] == "collection"}
    assert listed == {harbour: "harbour", clash: clash}
    assert [m["id"] for m in data if m["kind"] == "generator"] == ["smollm2"]
