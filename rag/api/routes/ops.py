"""Operations endpoints: /healthz (alive), /readyz (can serve), /metrics (Prometheus).

/healthz and /readyz need no API key (probes carry none); neither says anything about any
tenant's data: /readyz counts indexes, it never names a collection. /metrics needs an admin
key (Authorization: Bearer <admin key>, which Prometheus sends with `authorization:
{credentials: ...}`), because collection ids and
volumes are operational data; `metrics.public=true` opens it for a scraper on a private
network. With `metrics.enabled=false` it answers 404.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Header, Request, Response
from fastapi.responses import JSONResponse

from rag import __version__
from rag.api.body import Router
from rag.api.deps import PoolsDep, ServicesDep
from rag.api.openapi import errors
from rag.api.schemas import Health
from rag.auth import authenticate, require_admin
from rag.errors import NotFound
from rag.ops.metrics import CONTENT_TYPE
from rag.services import Services

router = Router(tags=["ops"])
log = logging.getLogger(__name__)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Process alive. Needs no API key."""
    return Health(status="ok", version=__version__)


@router.get(
    "/readyz",
    responses={503: {"description": "not ready: the body says which checks failed"}},
)
async def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    """Ready to serve: the database answers, the embedding model is loaded, and every open
    vector index is caught up with the change log (its last catch-up finished, at most a
    batch behind). An index being rebuilt is counted, not a failure: its old generation
    serves until the new one is swapped in, so one tenant's rebuild never takes the replica
    out. The generator is built in the background as the service starts (or on the first
    ask), so `generator.loaded` and `generator.loading` are reported, not required; once
    loaded, its step thread must be alive (one that died leaves every ask waiting). 200 with
    the checks, or 503 with the same body saying what failed (counts, never collection ids).
    Needs no API key, so it is cheap: one database ping, no query per index, and answered
    from a result at most `metrics.readyz_cache_s` old, on the event loop. One check runs at
    a time (in a thread); probes that arrive meanwhile wait for its answer."""
    checks = _fresh(request.app.state, services.settings.metrics.readyz_cache_s)
    if checks is None:
        checks = await _check(request.app.state, services)
    ready = all(c["ok"] for c in checks.values())
    body = {"status": "ready" if ready else "not ready", "checks": checks}
    return JSONResponse(body, 200 if ready else 503)


async def _check(state: Any, services: Services) -> dict[str, Any]:
    """A new answer, or the one a check already running gives: one at a time."""
    lock: asyncio.Lock | None = getattr(state, "readyz_lock", None)
    if lock is None:
        lock = state.readyz_lock = asyncio.Lock()
    async with lock:
        fresh = _fresh(state, services.settings.metrics.readyz_cache_s)
        if fresh is not None:
            return fresh
        checks = await anyio.to_thread.run_sync(readiness, services)
        state.readyz = (time.monotonic(), checks)
        return checks


def _fresh(state: Any, ttl: float) -> dict[str, Any] | None:
    cached: tuple[float, dict[str, Any]] | None = getattr(state, "readyz", None)
    if cached is not None and time.monotonic() - cached[0] < ttl:
        return cached[1]
    return None


def readiness(services: Services) -> dict[str, dict[str, Any]]:
    checks: dict[str, dict[str, Any]] = {}
    try:
        services.db.ping()
        checks["database"] = {"ok": True}
    except Exception as exc:
        log.warning("readiness: database unreachable: %s", type(exc).__name__)
        checks["database"] = {"ok": False, "error": f"database unreachable ({type(exc).__name__})"}
    try:
        dim = services.embedder.dim
        checks["embedder"] = {"ok": dim > 0, "model": services.embedder.model_id, "dim": dim}
    except Exception as exc:
        checks["embedder"] = {"ok": False, "error": f"embedding model not loaded: {exc}"}
    # Loaded in the background at start (an ingest-only process never loads it): whether the
    # next ask waits for the load is worth knowing, but it is not a reason to refuse traffic.
    generator: dict[str, Any] = {
        "ok": True,
        "loaded": services.engine_loaded,
        "loading": services.engine_loading,
    }
    if services.engine_loaded and not services.engine.step_alive():
        generator.update(ok=False, error="the generator's step thread has died")
    checks["generator"] = generator
    checks["indexes"] = _indexes(services)
    return checks


# An index counts as not caught up once no catch-up has finished for this long while nothing
# holds it (the loop catches every open index up every RAG_INDEX__CATCH_UP_INTERVAL_S, 0.5 s
# by default; a snapshot or repair in progress holds the index's lock).
BEHIND_AFTER_S = 10.0


def _indexes(services: Services) -> dict[str, Any]:
    # Only indexes already open, and only what this process knows of them: a probe must not
    # open (and build) every collection's index, nor query SQL once per index.
    lives = list(services.indexes.lives())
    rebuilding = stale = behind = 0
    for _cid, live in lives:
        state = live.state()
        if state.building:
            rebuilding += 1  # the index it replaces serves meanwhile
            continue
        # A catch-up holds the index (applying changes, or waiting behind long searches):
        # a search that gave up waiting for it marked the index stale, but it serves and is
        # being caught up. Only an index nobody is catching up, with no catch-up finished
        # for BEHIND_AFTER_S, is not ready (stale: the last one failed).
        if live.lock.locked() or (
            state.caught_up_s_ago is not None and state.caught_up_s_ago <= BEHIND_AFTER_S
        ):
            continue
        if state.stale:
            stale += 1
        else:
            behind += 1
    out: dict[str, Any] = {"ok": not (stale or behind), "open": len(lives)}
    for name, count in (("rebuilding", rebuilding), ("stale", stale), ("behind", behind)):
        if count:
            out[name] = count
    if stale or behind:
        out["error"] = f"{stale + behind} of {len(lives)} open indexes not caught up"
    return out


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
        **errors(401, 403, 404, 422, 429),
    },
)
async def metrics(
    request: Request,
    services: ServicesDep,
    pools: PoolsDep,
    authorization: Annotated[
        str | None, Header(max_length=1024, description="Bearer <admin key>")
    ] = None,
) -> Response:
    """Prometheus metrics. Needs an admin key unless `metrics.public` is set."""
    instruments = getattr(request.app.state, "metrics", None)
    if instruments is None:
        raise NotFound("metrics are turned off (metrics.enabled=false)")
    if not services.settings.metrics.public:
        principal = services.key_cache.get(authorization)
        if principal is None:
            principal = await pools.auth.run(
                authenticate, services.db, authorization, services.key_cache
            )
        require_admin(principal)
    body = await pools.db.run(instruments.render)
    return Response(body, media_type=CONTENT_TYPE)
