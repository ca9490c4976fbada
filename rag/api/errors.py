"""The one place domain errors become HTTP responses, always with a JSON body."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

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
    errors.ParseError: 422,
    errors.GenerationFailed: 502,
}


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
        if isinstance(exc, errors.Overloaded):
            headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
        return JSONResponse(body(exc.code, exc.message, exc.detail), status, headers=headers)

    @app.exception_handler(RequestValidationError)
    @app.exception_handler(ValidationError)
    async def _validation(
        _: Request, exc: RequestValidationError | ValidationError
    ) -> JSONResponse:
        problems = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return JSONResponse(body("invalid", message, problems), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            body(code, str(exc.detail)), exc.status_code, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(body("internal", "internal error"), 500)
