"""Request ids, latency and status counts: one pure ASGI middleware, cheap by design.

Per request it reads one header, sets two contextvars, wraps `send` to add one header and
catch the status, and makes two observations into cached labelled children; no body is
touched. With metrics off it still gives every request its id (logs need it), and observes
nothing. The route label is the matched route's template (`/v1/collections/{collection_id}/
search`), never the raw path, so ids cannot blow up the label set; what no route matched is
labelled "unmatched".
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.ops.logs import new_id, request_id
from rag.ops.metrics import Metrics

if TYPE_CHECKING:
    from fastapi import FastAPI

    from rag.config import Settings

log = logging.getLogger(__name__)

HEADER = b"x-request-id"
# What a caller's id may look like to be echoed and logged as is (no spaces, no control
# characters, short): anything else is replaced by a fresh id.
_SANE = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


class RequestMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics | None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(scope)
        rid_header = (HEADER, rid.encode())
        status = 500
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        rid_token = request_id.set(rid)
        metrics = self.metrics
        if metrics is None:
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                request_id.reset(rid_token)
            return
        metrics_token = metrics.activate()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            metrics.observe_request(scope["method"], template, status, time.perf_counter() - t0)
            metrics.deactivate(metrics_token)
            request_id.reset(rid_token)


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == HEADER:
            if _SANE.match(value):
                return value.decode()
            break
    return new_id()


def install(app: FastAPI, settings: Settings) -> Metrics | None:
    """Give the app its own metrics and put the middleware outermost (add it after the
    others). With `metrics.enabled` off, the middleware only sets request ids, and None is
    returned."""
    metrics = None
    if settings.metrics.enabled:
        metrics = Metrics(lambda: getattr(app.state, "services", None))
    app.state.metrics = metrics
    app.add_middleware(RequestMetrics, metrics=metrics)
    return metrics
