"""What /openapi.json says beyond the route signatures: the error body every route answers
with, each status code a route can return, and the models of hand-written request bodies."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

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


def install(app: FastAPI) -> None:
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
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
