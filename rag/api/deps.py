"""Dependencies, as Annotated aliases so route signatures read as declarations."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from rag.auth import Principal, authenticate
from rag.services import Services


def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


async def current_principal(
    services: ServicesDep,
    authorization: Annotated[str | None, Header(description="Bearer <API key>")] = None,
) -> Principal:
    # A key seen in the last moment resolves here, on the event loop; anything else (a new
    # key, a wrong one) goes to the database on a worker thread.
    principal = services.key_cache.get(authorization)
    if principal is not None:
        return principal
    return await run_in_threadpool(authenticate, services.db, authorization, services.key_cache)


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
