"""Tenants and API keys (rag.db.keys): a key resolves to its tenant until it is revoked."""

from __future__ import annotations

import pytest

from rag.db import Database, IntegrityError, keys
from rag.errors import Invalid


def test_a_tenant_is_found_by_name_and_made_only_when_asked(db: Database) -> None:
    with db.write() as s:
        with pytest.raises(Invalid):
            keys.tenant(s, "acme", create=False)
        made = keys.tenant(s, "acme", create=True)
        assert keys.tenant(s, "acme", create=True).id == made.id
    with db.read() as s:
        assert keys.tenant(s, "acme", create=False).id == made.id


def test_a_key_resolves_to_its_tenant_until_revoked(db: Database) -> None:
    with db.write() as s:
        acme, globex = keys.tenant(s, "acme", create=True), keys.tenant(s, "globex", create=True)
        user = keys.add(s, acme.id, "h-user", "rag_user", is_admin=False)
        admin = keys.add(s, acme.id, "h-admin", "rag_admin", is_admin=True)
        theirs = keys.add(s, globex.id, "h-theirs", "rag_their", is_admin=False)

    with db.connect() as conn:
        assert keys.live_by_hash(conn, "h-user") == keys.LiveKey(
            "h-user", acme.id, False, user.id, "acme"
        )
        assert keys.live_by_hash(conn, "h-admin") == keys.LiveKey(
            "h-admin", acme.id, True, admin.id, "acme"
        )
        assert keys.live_by_hash(conn, "h-nobody") is None
    with db.read() as s:
        assert [k.id for k in keys.of_tenant(s, acme.id)] == [user.id, admin.id]
        assert keys.live_admin_exists(s)

    with db.write() as s:
        assert keys.revoke(s, admin.id) is True
        assert keys.revoke(s, admin.id) is False  # already revoked
        assert keys.revoke(s, "nope") is False
    with db.connect() as conn:
        assert keys.live_by_hash(conn, "h-admin") is None
        assert keys.live_by_hash(conn, "h-theirs") is not None
    with db.read() as s:
        assert not keys.live_admin_exists(s)
        revoked = keys.by_hash(s, "h-admin")  # still there, for the listing
        assert revoked is not None and revoked.revoked_at is not None
        assert [k.id for k in keys.of_tenant(s, acme.id)] == [user.id, admin.id]
        assert {k.id for k in keys.list_all(s)} == {user.id, admin.id, theirs.id}
        got = keys.get(s, user.id)
        assert got is not None and got.prefix == "rag_user"


def test_two_keys_cannot_share_a_hash(db: Database) -> None:
    with db.write() as s:
        tenant = keys.tenant(s, "acme", create=True)
        keys.add(s, tenant.id, "same", "p1", is_admin=False)
    with pytest.raises(IntegrityError), db.write() as s:
        keys.add(s, tenant.id, "same", "p2", is_admin=False)
