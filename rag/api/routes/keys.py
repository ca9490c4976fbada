"""API keys: create (admin), list (admin), the caller's own, revoke (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Response

from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, errors
from rag.api.schemas import KeyCreate, KeyCreated, KeyInfo
from rag.auth import create_key_with_id, require_admin, revoke_key
from rag.db import keys
from rag.errors import Conflict, NotFound

router = Router(prefix="/v1/keys", tags=["keys"], responses=AUTHENTICATED)


@router.post("", status_code=201, response_model=KeyCreated, responses=errors(403, 413))
async def create(
    body: KeyCreate, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> KeyCreated:
    """Admin only: create an API key for a tenant (the tenant is created if new)."""
    require_admin(principal)
    key, tenant_id, key_id = await pools.db.run(
        lambda: create_key_with_id(services.db, body.tenant, is_admin=body.admin)
    )
    return KeyCreated(key=key, id=key_id, tenant=body.tenant.strip(), tenant_id=tenant_id)


@router.get("", response_model=list[KeyInfo], responses=errors(403))
async def list_keys(
    services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> list[KeyInfo]:
    """Admin only: every key, revoked ones included, newest first (never the keys
    themselves: only the first characters of generated ones)."""
    require_admin(principal)

    def listing() -> list[KeyInfo]:
        with services.db.read() as session:
            return [KeyInfo.of(k) for k in keys.list_all(session)]

    return await pools.db.run(listing)


@router.get("/me", response_model=KeyInfo, responses=errors(404))
async def me(services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep) -> KeyInfo:
    """The key this request was made with (never the key itself)."""

    def own() -> KeyInfo | None:
        with services.db.read() as session:
            key = keys.get(session, principal.key_id)
            return None if key is None else KeyInfo.of(key)

    info = await pools.db.run(own)
    if info is None:  # revoked and purged between authentication and now
        raise NotFound("this request's key no longer exists")
    return info


@router.delete(
    "/{key_id}", status_code=204, response_class=Response, responses=errors(403, 404, 409)
)
async def revoke(
    key_id: Annotated[str, Path(max_length=64)],
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> Response:
    """Admin only: revoke a key. It stops working at once on this server, and within
    `auth.key_cache_s` (1 s by default) on other replicas."""
    require_admin(principal)
    if key_id == principal.key_id:
        raise Conflict("this request is made with that key: revoke it with another admin key")
    if not await pools.db.run(revoke_key, services.db, key_id, services.key_cache):
        raise NotFound(f"no live API key with id {key_id!r}")
    return Response(status_code=204)
