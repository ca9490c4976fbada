"""Dependencies, as Annotated aliases so route signatures read as declarations."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from rag.api.pools import Pools, current_tenant
from rag.auth import Principal, authenticate
from rag.services import Services


# Async, so that resolving them never takes a thread.
async def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def get_pools(request: Request) -> Pools:
    return request.app.state.pools  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]
PoolsDep = Annotated[Pools, Depends(get_pools)]


async def current_principal(
    services: ServicesDep,
    pools: PoolsDep,
    authorization: Annotated[
        str | None, Header(max_length=1024, description="Bearer <API key>")
    ] = None,
) -> Principal:
    # A key seen in the last moment resolves here, on the event loop; anything else (a new
    # key, a wrong one) goes to the database on a key-lookup thread (429 when all are busy).
    principal = services.key_cache.get(authorization)
    if principal is None:
        # Waits in its key's line (unknown keys share one): see KeyCache.line_of.
        line = current_tenant.set(services.key_cache.line_of(authorization))
        try:
            principal = await pools.auth.run(
                authenticate, services.db, authorization, services.key_cache
            )
        finally:
            current_tenant.reset(line)
    # The route runs in this context: its pool work waits in this tenant's line.
    current_tenant.set(principal.tenant_id)
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
