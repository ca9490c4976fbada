"""The web console: static files served by the API process itself, and the tuning route
it draws the recall/latency curve from.

The console is plain HTML/JS with no build step. Every console response carries a strict
Content-Security-Policy: scripts and styles only from this origin, no inline script, images
only from this origin or data: URLs, so nothing inside a document can load a remote resource
or run script even if it were ever rendered by mistake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import Path as PathParam
from fastapi.responses import FileResponse, RedirectResponse

from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, errors
from rag.api.schemas_search import TuningOut
from rag.db import collections
from rag.errors import NotFound
from rag.ops.tune import TuneReport
from rag.services import Services

router = Router()

STATIC = Path(__file__).resolve().parent.parent / "console"

# The files the console is made of, and nothing else: no path from a request reaches the disk.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "sse.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
}

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _file(name: str) -> FileResponse:
    if name not in FILES:
        raise NotFound(f"no console file {name!r}")
    return FileResponse(STATIC / name, media_type=FILES[name], headers=HEADERS)


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse("/console", status_code=307)


@router.get("/console", include_in_schema=False)
async def console() -> FileResponse:
    return _file("index.html")


@router.get("/console/{name}", include_in_schema=False)
async def console_file(name: str) -> FileResponse:
    return _file(name)


@router.get(
    "/v1/collections/{collection_id}/tuning",
    response_model=TuningOut,
    tags=["collections"],
    responses={**AUTHENTICATED, **errors(404)},
)
async def get_tuning(
    collection_id: Annotated[str, PathParam(max_length=64)],
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> TuningOut:
    """The recall-versus-latency measurements `rag tune` stored for the collection (404 when it
    was never tuned). `search_defaults` are the knobs searches use now."""
    return await pools.db.run(_tuning, services, principal.tenant_id, collection_id)


def _tuning(services: Services, tenant_id: str, collection_id: str) -> TuningOut:
    with services.db.read() as session:
        c = collections.get(session, tenant_id, collection_id)
        if not c.tuning:
            raise NotFound(f"collection {collection_id} has not been tuned: run `rag tune`")
        report = TuneReport.from_dict(c.tuning, c.id, c.index_kind)
        return TuningOut.of(report, c.search_defaults)
