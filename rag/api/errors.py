"""The one place domain errors become HTTP responses, always with a JSON body."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from rag import errors

log = logging.getLogger(__name__)

STATUS: dict[type[errors.RagError], int] = {
    errors.NotFound: 404,
    errors.Invalid: 422,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.Overloaded: 429,
    errors.Unavailable: 503,
    errors.ParseError: 422,
    errors.GenerationFailed: 502,
}


# Validation problems returned in one 422, and the most characters of each part of one.
MAX_PROBLEMS = 10
MAX_PROBLEM_CHARS = 200


def _clip(value: object) -> object:
    if isinstance(value, int):
        return value
    text = str(value)
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS] + "..."


def _problem(e: Any) -> dict[str, Any]:
    loc = [_clip(p) for p in list(e.get("loc", ()))[:16]]
    return {"loc": loc, "msg": _clip(e.get("msg", "")), "type": _clip(e.get("type", ""))}


def _allowed(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET", "type": "http"})
        route_methods = getattr(route, "methods", None)
        if match != Match.NONE and route_methods:
            methods |= set(route_methods)
    return sorted(methods)


def body(code: str, message: str, detail: object | None = None) -> dict[str, object]:
    out: dict[str, object] = {"error": {"code": code, "message": message}}
    if detail is not None:
        out["error"]["detail"] = detail  # type: ignore[index]
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(errors.RagError)
    async def _domain(_: Request, exc: errors.RagError) -> JSONResponse:
        status = next((s for t, s in STATUS.items() if isinstance(exc, t)), 400)
        headers = {}
        if isinstance(exc, errors.Unauthorized):
            headers["WWW-Authenticate"] = "Bearer"
        if isinstance(exc, errors.Overloaded | errors.Unavailable):
            headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
        return JSONResponse(body(exc.code, exc.message, exc.detail), status, headers=headers)

    @app.exception_handler(RequestValidationError)
    @app.exception_handler(ValidationError)
    async def _validation(
        _: Request, exc: RequestValidationError | ValidationError
    ) -> JSONResponse:
        # A body with a million unknown keys has a million errors: say how many, show a few.
        found = exc.errors()
        problems = [_problem(e) for e in found[:MAX_PROBLEMS]]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        if len(found) > 1:
            message += f" (and {len(found) - 1} more problems)"
        return JSONResponse(body("invalid", message, problems), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, errors.RagError):
            # FastAPI reports any failure while reading a body as a 400; one of ours (a body
            # past the route's limit: 413) says what really happened.
            return await _domain(request, exc.__cause__)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # A body that does not decode (not UTF-8, not JSON): invalid input, as a body that
            # is JSON but wrong is.
            return JSONResponse(body("invalid", "the request body is not valid JSON"), 422)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path; a path
            # served by several routes (GET and POST /v1/collections) takes all of theirs.
            headers["Allow"] = ", ".join(_allowed(request))
        return JSONResponse(body(code, str(exc.detail)), exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(body("internal", "internal error"), 500)
