"""create_app(settings, services=None): the FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from rag import __version__, heap
from rag.api import errors, openapi
from rag.api.limits import BodyLimit, TenantRequests, path_pattern
from rag.api.middleware import install as install_metrics
from rag.api.pools import Pools
from rag.api.routes import (
    ask,
    collections,
    console,
    conversations,
    documents,
    jobs,
    keys,
    openai,
    ops,
    quality,
    search,
)
from rag.auth import KeyCache
from rag.config import Settings
from rag.services import Services, build_services

# multipart boundaries and headers around the files themselves
MULTIPART_OVERHEAD = 64 * 1024


def _key_cache(app: FastAPI) -> KeyCache | None:
    services = getattr(app.state, "services", None)
    return None if services is None else services.key_cache


def create_app(
    settings: Settings, services: Services | None = None, *, freeze_heap: bool = False
) -> FastAPI:
    """The API over `services` (built at start-up when None). `freeze_heap`: once started,
    and again once the generator is loaded, the objects alive are kept out of later full
    garbage collections (rag.heap; a serving process's entry point sets it)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or build_services(settings)
        app.state.services = svc
        svc.start()
        if freeze_heap:
            svc.freeze_heap = True
            heap.freeze()
        if settings.engine.load_at_start:
            svc.load_engine()
        try:
            yield
        finally:
            svc.close()

    app = FastAPI(
        title="ragserve",
        version=__version__,
        description="Private documents in, grounded answers with citations out.",
        lifespan=lifespan,
    )
    if services is not None:
        app.state.services = services
    app.state.pools = Pools(settings.api)
    errors.install(app)
    openapi.install(app, settings)
    upload = ("POST", path_pattern(documents.UPLOAD_PATH), settings.ingest.max_upload_bytes)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.api.max_json_body_bytes,
        larger=[(upload[0], upload[1], upload[2] + MULTIPART_OVERHEAD)],
    )
    app.add_middleware(
        TenantRequests, limit=settings.api.tenant_requests, key_cache=lambda: _key_cache(app),
        refusals_per_s=settings.api.advanced.refusals_per_s,
        probes_per_s=settings.api.advanced.probes_per_s,
    )  # fmt: skip
    install_metrics(app, settings)  # outermost: times and tags everything inside
    routers = (
        ops, keys, collections, documents, jobs, search, console, ask, openai, conversations,
        quality,
    )  # fmt: skip
    for module in routers:
        app.include_router(module.router)
    return app
