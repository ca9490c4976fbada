"""JSON request bodies parsed by orjson rather than the standard library's json.

FastAPI parses a route's JSON body on the event loop, before the route's dependencies run,
so every tenant's requests wait while one body is parsed (bench/abuse.py's attack of a
megabyte of made-up keys, and its `loop_stall_max_ms`). orjson reads the same documents
several times faster, and it refuses what is not JSON (NaN, Infinity, unpaired surrogates)
where `json.loads` lets it through; its error is a `json.JSONDecodeError`, which FastAPI
answers with 422.

Every router of the API is a `Router`, so every route parses this way
(tests/api/test_tenant_requests.py checks that none was left out).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute


class JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by orjson."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route


class Router(APIRouter):
    """An APIRouter of JsonRoutes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(route_class=JsonRoute, **kwargs)
