"""Conversations through the real app (SQLite and PostgreSQL) with a fake generator: turns
stored with the query each searched, follow-ups resolved in /ask, /search and chat
completions, ownership by key and tenant, bounds, quotas and bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rag.auth import create_key
from tests.answer.conftest import FakeEngine, ingest, parse_sse
from tests.conftest import Api

FACTS = [
    "The Kestrel ferry to Marlow Island leaves from pier 4 at 9:00 every morning.",
    "Storm warnings for Marlow Island are broadcast on marine radio channel 16.",
]
Q1 = "Which pier does the Kestrel ferry leave from?"
Q2 = "When does it leave?"
RESOLVED = "When does Kestrel leave?"


def _api(make_api: Callable[..., Api], db_url: str, embedder: Any, **kw: Any) -> Api:
    api = make_api(db_url, embedder, engine=FakeEngine("It leaves at 9:00."), **kw)
    api.services.settings.ask.relevance_threshold = -1.0  # the hash embedder scores at random
    return api


def _ready(make_api: Callable[..., Api], db_url: str, embedder: Any) -> tuple[Api, str, str]:
    """An app, a collection of tenant A holding the first fact, and a conversation in it."""
    api = _api(make_api, db_url, embedder)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS[:1])
    return api, cid, _conversation(api, api.a, cid)


def _conversation(api: Api, headers: dict[str, str], cid: str) -> str:
    r = api.client.post(f"/v1/collections/{cid}/conversations", headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["turns"] == [] and r.json()["turn_count"] == 0
    return str(r.json()["id"])


def _ask(api: Api, headers: dict[str, str], cid: str, question: str, **body: Any) -> Any:
    return api.client.post(
        f"/v1/collections/{cid}/ask", json={"question": question, "k": 2, **body}, headers=headers
    )


def test_a_conversation_stores_its_turns_and_resolves_its_follow_ups(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api = _api(make_api, db_url, hash_embedder)
    engine = api.services.engine
    assert isinstance(engine, FakeEngine)
    cid = api.collection(api.a)
    docs = ingest(api, api.a, cid, FACTS)
    conv = _conversation(api, api.a, cid)

    first = _ask(api, api.a, cid, Q1, conversation_id=conv)
    assert first.status_code == 200, first.text
    out = first.json()
    assert (out["searched_query"], out["rewritten"], out["conversation_id"]) == (Q1, False, conv)
    r = _ask(api, api.a, cid, Q2, conversation_id=conv, stream=True)
    assert r.status_code == 200, r.text
    final = parse_sse(r.text)[-1][1]
    assert (final["searched_query"], final["rewritten"]) == (RESOLVED, True)
    assert final["answer_source"] != "refused" and final["conversation_id"] == conv
    # The prompt: the passage with the first question, its answer, then the follow-up.
    prompt = engine.prompts[-1]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert "<passage 1>" in prompt[1]["content"] and Q1 in prompt[1]["content"]
    assert prompt[2]["content"] == " ".join(out["answer"].replace("[1]", " ").split())
    assert prompt[3]["content"].startswith(f"Question: {RESOLVED}")

    got = api.client.get(f"/v1/collections/{cid}/conversations/{conv}", headers=api.a).json()
    assert [t["question"] for t in got["turns"]] == [Q1, Q2]
    assert [t["searched_query"] for t in got["turns"]] == [Q1, RESOLVED]
    assert got["turns"][1]["answer"] == final["answer"]
    assert got["turns"][1]["citations"] == final["citations"]
    assert {c["document_id"] for t in got["turns"] for c in t["citations"]} == {docs[0]}
    assert got["turn_count"] == 2 and got["first_question"] == Q1 and got["bytes"] > 0

    # The same follow-up with the history in the request, and with rewriting turned off.
    history = [{"question": Q1, "answer": out["answer"]}]
    r = _ask(api, api.a, cid, Q2, history=history)
    assert r.json()["searched_query"] == RESOLVED and r.json()["conversation_id"] is None
    r = _ask(api, api.a, cid, Q2, history=history, rewrite=False)
    assert r.json()["searched_query"] == Q2 and not r.json()["rewritten"]
    # /search says what it searched.
    body = {"query": Q2, "history": history, "k": 2}
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=api.a)
    assert r.status_code == 200 and r.json()["searched_query"] == RESOLVED
    r = api.client.post(f"/v1/collections/{cid}/search", json={"query": Q2}, headers=api.a)
    assert r.json()["searched_query"] == Q2
    # Chat completions read the conversation from the messages; nothing is stored.
    messages = [
        {"role": "user", "content": Q1},
        {"role": "assistant", "content": out["answer"]},
        {"role": "user", "content": Q2},
    ]
    r = api.client.post("/v1/chat/completions", json={"model": cid, "messages": messages},
                        headers=api.a)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["ragserve"]["searched_query"] == RESOLVED
    listed = api.client.get(f"/v1/collections/{cid}/conversations", headers=api.a).json()
    assert [c["id"] for c in listed["conversations"]] == [conv]


def test_conversations_are_listed_a_page_at_a_time(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api = _api(make_api, db_url, hash_embedder)
    cid = api.collection(api.a)
    made = [_conversation(api, api.a, cid) for _ in range(3)]
    url = f"/v1/collections/{cid}/conversations"
    page = api.client.get(url, params={"limit": 2}, headers=api.a).json()
    assert len(page["conversations"]) == 2 and page["next_cursor"]
    rest = api.client.get(url, params={"limit": 2, "cursor": page["next_cursor"]}, headers=api.a)
    assert rest.json()["next_cursor"] is None
    seen = [c["id"] for c in page["conversations"] + rest.json()["conversations"]]
    assert sorted(seen) == sorted(made) and len(set(seen)) == 3
    bad = api.client.get(url, params={"cursor": "not-a-cursor"}, headers=api.a)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid"


def test_a_conversation_belongs_to_its_key_and_its_tenants_admins(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api, cid, conv = _ready(make_api, db_url, hash_embedder)
    assert _ask(api, api.a, cid, Q1, conversation_id=conv).status_code == 200
    db = api.services.db
    other_key = {"Authorization": f"Bearer {create_key(db, 'tenant-a')[0]}"}
    a_admin = {"Authorization": f"Bearer {create_key(db, 'tenant-a', is_admin=True)[0]}"}
    b_admin = {"Authorization": f"Bearer {create_key(db, 'tenant-b', is_admin=True)[0]}"}
    url = f"/v1/collections/{cid}/conversations"

    for outsider in (api.b, b_admin, other_key):
        assert api.client.get(f"{url}/{conv}", headers=outsider).status_code == 404
        assert api.client.delete(f"{url}/{conv}", headers=outsider).status_code == 404
        r = _ask(api, outsider, cid, Q2, conversation_id=conv)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert api.client.get(url, headers=other_key).json()["conversations"] == []
    # Tenant B cannot even name tenant A's collection.
    assert api.client.get(url, headers=api.b).status_code == 404
    assert api.client.get(url, headers=b_admin).status_code == 404
    # The tenant's admin keys see and delete every conversation of the tenant.
    mine = _conversation(api, other_key, cid)
    listed = api.client.get(url, headers=a_admin).json()["conversations"]
    assert {c["id"] for c in listed} == {conv, mine}
    assert api.client.get(f"{url}/{conv}", headers=a_admin).json()["turn_count"] == 1
    assert api.client.delete(f"{url}/{conv}", headers=a_admin).status_code == 204
    assert api.client.get(f"{url}/{conv}", headers=api.a).status_code == 404
    assert _ask(api, api.a, cid, Q2, conversation_id=conv).status_code == 404
    assert [c["id"] for c in api.client.get(url, headers=other_key).json()["conversations"]] == [
        mine
    ]


def test_a_history_past_its_bounds_and_bad_input_are_clear_errors(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api, cid, conv = _ready(make_api, db_url, hash_embedder)
    turn = {"question": Q1, "answer": "Pier 4."}

    r = _ask(api, api.a, cid, Q2, history=[turn] * 21)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert r.json()["error"]["detail"]["limit"] == "history_turns"
    r = _ask(api, api.a, cid, Q2, history=[{"question": Q1, "answer": "x" * 15_000}] * 2)
    assert r.status_code == 413 and r.json()["error"]["detail"]["limit"] == "history_chars"
    search = {"query": Q2, "history": [turn] * 21}
    r = api.client.post(f"/v1/collections/{cid}/search", json=search, headers=api.a)
    assert r.status_code == 413
    for bad in (
        {"history": [turn], "conversation_id": conv},
        {"history": [{"question": " ", "answer": ""}]},
        {"history": [{"answer": "no question"}]},
        {"history": "not a list"},
        {"rewrite": "yes"},
        {"conversation_id": ""},
    ):
        r = _ask(api, api.a, cid, Q2, **bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid"
    r = _ask(api, api.a, cid, Q2, conversation_id="0" * 32)
    assert r.status_code == 404
    r = api.client.post(f"/v1/collections/{'0' * 32}/conversations", headers=api.a)
    assert r.status_code == 404
    r = api.client.get(f"/v1/collections/{cid}/conversations/{'x' * 65}", headers=api.a)
    assert r.status_code == 422


def test_conversation_quotas_refuse_with_a_403(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    quota = {"max_conversations": 1, "max_conversation_mb": 1000 / (1024 * 1024)}
    api = _api(make_api, db_url, hash_embedder, sections={"quota": quota})
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS[:1])
    conv = _conversation(api, api.a, cid)
    url = f"/v1/collections/{cid}/conversations"
    r = api.client.post(url, headers=api.a)
    assert r.status_code == 403 and r.json()["error"]["detail"]["quota"] == "conversations"
    # Another tenant has its own.
    assert (
        api.client.post(url.replace(cid, api.collection(api.b)), headers=api.b).status_code == 201
    )
    assert _ask(api, api.a, cid, Q1, conversation_id=conv).status_code == 200
    long = Q1[:-1] + " " + "please " * 120 + "?"
    r = _ask(api, api.a, cid, long, conversation_id=conv)
    assert r.status_code == 403 and r.json()["error"]["detail"]["quota"] == "conversation_bytes"
    got = api.client.get(f"{url}/{conv}", headers=api.a).json()
    assert got["turn_count"] == 1
    # A delete frees the quota at once.
    assert api.client.delete(f"{url}/{conv}", headers=api.a).status_code == 204
    assert api.client.post(url, headers=api.a).status_code == 201
