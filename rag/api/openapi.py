"""What /openapi.json says beyond the route signatures: the error body every route answers
with, each status code a route can return, and the models of hand-written request bodies."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from rag.config import Settings
from rag.index import KINDS, index_class
from rag.index.params import json_schema

REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    code: str = Field(description="a stable word: invalid, not_found, overloaded, ...")
    message: str = Field(description="what is wrong, for a person")
    detail: Any | None = Field(None, description="for `invalid`: the first problems found")


class ErrorOut(BaseModel):
    error: ErrorDetail


_WHY = {
    400: "the request could not be read",
    401: "no API key, or not a valid one",
    403: "this key may not do that (an admin key is needed, or a quota is reached)",
    404: "no such resource for this key (another tenant's ids answer 404 too)",
    405: "the path does not take this method (`Allow` lists those it takes)",
    409: "the request conflicts with the current state",
    413: "the request body is larger than this route accepts",
    415: "the body's media type (or an uploaded file's) is not supported",
    422: "the request is invalid: `error.detail` lists the first problems",
    429: "overloaded: retry after `Retry-After` seconds",
    502: "the generator failed while answering",
    503: "not ready",
}
_HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    405: {"Allow": {"schema": {"type": "string"}, "description": "the methods the path takes"}},
    429: {
        "Retry-After": {
            "schema": {"type": "integer", "minimum": 1},
            "description": "seconds to wait before trying again",
        }
    },
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for these status codes, each with the error body (and its headers)."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorOut, "description": _WHY[code]}
        if code in _HEADERS:
            entry["headers"] = _HEADERS[code]
        out[code] = entry
    return out


# What every authenticated route can answer: no key, invalid input, and a refusal when the
# threads that look keys up (and run its work) are all busy.
AUTHENTICATED = errors(401, 422, 429)
# ... and, for routes that take a body, one too large for them.
WITH_BODY = errors(401, 413, 422, 429)

# Request bodies written by hand in `openapi_extra` (the upload route reads its own body).
_EXTRA_MODELS: list[type[BaseModel]] = []


def document(*models: type[BaseModel]) -> None:
    """Name models that hand-written request bodies refer to, so that their $refs resolve."""
    _EXTRA_MODELS.extend(m for m in models if m not in _EXTRA_MODELS)


def install(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            _, extra = models_json_schema(
                [(m, "validation") for m in _EXTRA_MODELS], ref_template=REF
            )
            for name, schema in extra.get("$defs", {}).items():
                schemas.setdefault(name, schema)
            _configured_limits(schemas, settings)
            _index_specs(schemas, available_kinds(settings))
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def available_kinds(settings: Settings) -> list[str]:
    """The index kinds this deployment can build (milvus only with a Milvus to talk to)."""
    return [k for k in KINDS if k != "milvus" or settings.milvus.uri]


def _configured_limits(schemas: dict[str, Any], settings: Settings) -> None:
    """Where the service is configured tighter than a request model's static bound, say the
    configured one (a search's k, a question's length, an answer's tokens)."""
    limits = {
        ("SearchIn", "k"): ("maximum", settings.search.max_k),
        ("SearchIn", "query"): ("maxLength", settings.search.max_query_chars),
        ("SearchDefaultsIn", "k"): ("maximum", settings.search.max_k),
        ("AskIn", "k"): ("maximum", settings.search.max_k),
        ("AskIn", "question"): ("maxLength", settings.ask.max_question_chars),
        ("AskIn", "max_tokens"): ("maximum", settings.ask.max_tokens_limit),
    }
    for (model, field), (key, value) in limits.items():
        prop = schemas.get(model, {}).get("properties", {}).get(field)
        if prop is None:
            continue
        for branch in prop.get("anyOf", [prop]):
            if key in branch:
                branch[key] = min(branch[key], value)


def _index_specs(schemas: dict[str, Any], kinds: list[str]) -> None:
    """An index's `params` as each kind declares them (rag.index.params), instead of one
    free object: IndexIn and RebuildIn become one alternative per kind."""
    none: dict[str, Any] = {"type": "object", "maxProperties": 0}  # auto takes none

    def params(kind: str) -> dict[str, Any]:
        if kind == "auto":
            return none
        return json_schema(index_class(kind).param_schema)

    def variant(kind: str, params: dict[str, Any], *, required: bool) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"kind": {"const": kind}, "params": params},
            "required": ["kind"] if required else [],
            "additionalProperties": False,
        }

    if "IndexIn" in schemas:
        schemas["IndexIn"] = {
            "title": "IndexIn",
            "description": "the index kind and its build parameters (auto: chosen by size)",
            "anyOf": [
                variant("auto", none, required=False),
                *(variant(k, params(k), required=True) for k in kinds),
            ],
        }
    if "RebuildIn" in schemas:
        same = {
            "type": "object",
            "description": "the collection's kind and parameters as they are",
            "properties": {"kind": {"type": "null"}, "params": {"type": "null"}},
            "additionalProperties": False,
        }
        into = [
            variant(k, {"anyOf": [params(k), {"type": "null"}]}, required=True)
            for k in ("auto", *kinds)
        ]
        schemas["RebuildIn"] = {
            "title": "RebuildIn",
            "description": "rebuild as it is, or into a kind with its parameters",
            "anyOf": [same, *into],
        }
