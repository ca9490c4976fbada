"""Every request field is bounded in its schema (so /openapi.json states it), and what is out
of bounds is a 422 before any work: the generator is never asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.answer.conftest import FakeEngine
from tests.conftest import Api

CHAT = "/v1/chat/completions"


def _chat(api: Api, **body: Any) -> Any:
    body.setdefault("model", "smollm2")
    body.setdefault("messages", [{"role": "user", "content": "hello"}])
    return api.client.post(CHAT, json=body, headers=api.a)


@pytest.fixture
def chat_api(make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any) -> Api:
    return make_api(sqlite_url, hash_embedder, engine=FakeEngine(answer="hi"))


@pytest.mark.parametrize(
    "body",
    [
        {"stop": ["x"] * 9},
        {"stop": ["y" * 65]},
        {"stop": ""},
        {"stop": [""]},
        {"stop": "z" * 65},
        {"seed": 10**30},
        {"seed": 2**53},
        {"messages": [{"role": "assistant", "content": "no user turn"}]},
        {"messages": [{"role": "user", "content": "   "}]},
        {"temperature": True},
        {"stream": 0},
        {"seed": -1},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"top_k": 10**9},
        {"top_k": -1},
        {"user": "u" * 257},
        {"messages": [{"role": "user", "content": "m"}] * 257},
        {"messages": [{"role": "user", "content": "m" * 32_001}]},
        {"messages": [{"role": "user", "content": "m" * 30_000}] * 3},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "t"}] * 33}]},
        {"messages": [{"role": "user", "content": "hi", "name": "n" * 65}]},
    ],
)
def test_chat_out_of_bounds_is_422_before_the_generator(chat_api: Api, body: dict) -> None:
    r = _chat(chat_api, **body)
    assert r.status_code == 422, (body, r.text[:300])
    assert r.json()["error"]["code"] == "invalid"
    assert chat_api.services.engine.prompts == []  # type: ignore[attr-defined]


def test_chat_within_bounds_is_answered(chat_api: Api) -> None:
    r = _chat(
        chat_api, stop=["a" * 64] * 8, seed=2**53 - 1, presence_penalty=-2, top_k=40, user="me"
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hi"


def test_plain_chat_refuses_more_text_than_configured_before_tokenizing(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    counted: list[object] = []

    class Counting(FakeEngine):
        def count_tokens(self, prompt: Any) -> int:
            counted.append(prompt)
            return super().count_tokens(prompt)

    engine = Counting(answer="hi")
    api = make_api(sqlite_url, hash_embedder, engine=engine)
    api.services.settings.ask.max_chat_chars = 1000
    r = _chat(
        api,
        messages=[{"role": "system", "content": "s" * 600}, {"role": "user", "content": "u" * 600}],
    )
    assert r.status_code == 422, r.text
    assert "1000" in r.json()["error"]["message"]
    assert engine.prompts == [] and counted == []
    assert _chat(api, messages=[{"role": "user", "content": "u" * 900}]).status_code == 200


def _resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _walk(spec: dict, schema: dict, where: str, seen: set[str]) -> list[str]:
    """Paths of strings, arrays, objects with free keys and numbers that have no bound."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return []
        seen = seen | {name}
        return _walk(spec, _resolve(spec, schema), where, seen)
    out: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, [])):
            out += _walk(spec, sub, f"{where}|{i}", seen)
    kind = schema.get("type")
    free = not ({"maxLength", "enum", "const", "format"} & schema.keys())
    if kind == "string" and free:
        out.append(where)
    if kind == "array":
        if "maxItems" not in schema:
            out.append(where)
        out += _walk(spec, schema.get("items", {}), f"{where}[]", seen)
    if kind == "object":
        for name, sub in schema.get("properties", {}).items():
            out += _walk(spec, sub, f"{where}.{name}", seen)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                out.append(where + "{}")
            out += _walk(
                spec, schema.get("propertyNames", {"type": "string"}), f"{where}<key>", seen
            )
            out += _walk(spec, extra, f"{where}{{}}", seen)
    if kind in ("integer", "number") and not ({"maximum", "exclusiveMaximum"} & schema.keys()):
        out.append(where)
    return out


def test_every_request_field_states_its_bound_in_openapi(sqlite_api: Api) -> None:
    spec = sqlite_api.client.get("/openapi.json").json()
    unbounded: list[str] = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                unbounded += _walk(spec, p["schema"], f"{method} {path} {p['name']}", set())
            for ctype, media in op.get("requestBody", {}).get("content", {}).items():
                if ctype == "application/json":
                    unbounded += _walk(spec, media["schema"], f"{method} {path} body", set())
    # Headers bounded by the server (h11) rather than the schema.
    unbounded = [u for u in unbounded if not u.endswith((" authorization", " x-request-id"))]
    assert unbounded == []
