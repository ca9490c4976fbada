"""Tenants and API keys. A key is stored as its sha256 only."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session

from rag.db.models import ApiKey, Tenant
from rag.errors import Invalid


def tenant(session: Session, name: str, *, create: bool) -> Tenant:
    """The tenant called `name`; created when `create`, else Invalid when there is none."""
    found = session.scalar(select(Tenant).where(Tenant.name == name))
    if found is None:
        if not create:
            raise Invalid(f"no tenant named {name!r}")
        found = Tenant(name=name)
        session.add(found)
        session.flush()
    return found


def add(session: Session, tenant_id: str, key_hash: str, prefix: str, *, is_admin: bool) -> ApiKey:
    row = ApiKey(tenant_id=tenant_id, key_hash=key_hash, prefix=prefix, is_admin=is_admin)
    session.add(row)
    session.flush()
    return row


def by_hash(session: Session, key_hash: str) -> ApiKey | None:
    """The key with this hash, revoked or not."""
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash))


def of_tenant(session: Session, tenant_id: str) -> list[ApiKey]:
    """The tenant's keys, revoked ones included, oldest first."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    return list(session.scalars(stmt.order_by(ApiKey.created_at, ApiKey.id)))


def live_admin_exists(session: Session) -> bool:
    stmt = select(ApiKey.id).where(ApiKey.is_admin.is_(True), ApiKey.revoked_at.is_(None))
    return session.scalar(stmt.limit(1)) is not None


# Prebuilt: it runs for every request whose key is not in the key cache.
_LIVE_BY_HASH = (
    select(ApiKey.key_hash, ApiKey.tenant_id, ApiKey.is_admin, ApiKey.id, Tenant.name)
    .join(Tenant, Tenant.id == ApiKey.tenant_id)
    .where(ApiKey.key_hash == bindparam("digest"), ApiKey.revoked_at.is_(None))
)


@dataclass(frozen=True)
class LiveKey:
    key_hash: str
    tenant_id: str
    is_admin: bool
    key_id: str
    tenant_name: str


def live_by_hash(conn: Connection, key_hash: str) -> LiveKey | None:
    """The live key with this hash, and its tenant; on a bare connection (hot path)."""
    row = conn.execute(_LIVE_BY_HASH, {"digest": key_hash}).first()
    return None if row is None else LiveKey(*row)


def get(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def list_all(session: Session) -> list[ApiKey]:
    """Every key, revoked ones included, newest first."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc())))


def revoke(session: Session, key_id: str) -> bool:
    """False when there is no such live key."""
    key = session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = time.time()
    return True
