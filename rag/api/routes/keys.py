from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from rag.api.deps import CurrentPrincipal, ServicesDep
from rag.api.schemas import KeyCreate, KeyCreated, KeyInfo
from rag.auth import create_key, require_admin
from rag.db.models import ApiKey

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=201, response_model=KeyCreated)
def create(body: KeyCreate, services: ServicesDep, principal: CurrentPrincipal) -> KeyCreated:
    """Admin only: create an API key for a tenant (the tenant is created if new)."""
    require_admin(principal)
    key, tenant_id = create_key(services.db, body.tenant, is_admin=body.admin)
    return KeyCreated(key=key, tenant=body.tenant.strip(), tenant_id=tenant_id)


@router.get("/me", response_model=KeyInfo)
def me(services: ServicesDep, principal: CurrentPrincipal) -> KeyInfo:
    """The key this request was made with (never the key itself)."""
    with services.db.read() as session:
        key = session.scalar(select(ApiKey).where(ApiKey.id == principal.key_id))
        assert key is not None
        return KeyInfo.of(key)
