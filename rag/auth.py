"""API keys: shown once, stored as a sha256 hash, resolved to a tenant on every request."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from rag.db import Database, IntegrityError, Session
from rag.db import keys as key_rows
from rag.errors import Forbidden, Invalid, Unauthorized

log = logging.getLogger(__name__)

ADMIN_TENANT = "admin"

# Besides its hash, a key's row keeps a prefix to tell keys apart in listings: for a generated
# key its first characters (random: they say nothing of the rest); for a key an operator
# configured, only this word (its first characters are part of a secret someone chose).
CONFIGURED = "configured"
# The admin key generated at first start, told apart from admin keys made through the API.
BOOTSTRAP = "rag_admin_"
MIN_CONFIGURED_CHARS = 16
ADMIN_KEY_FILE = "admin-key"


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    tenant_name: str
    is_admin: bool
    key_id: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(start: str = "rag_") -> str:
    return start + secrets.token_urlsafe(32)


def prefix_of(key: str) -> str:
    """What is stored of a generated key beside its hash: its start and 4-6 random chars."""
    return key[: len(BOOTSTRAP) + 4] if key.startswith(BOOTSTRAP) else key[:10]


def validate_tenant_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 200 or any(ord(c) < 32 for c in name):
        raise Invalid("tenant name must be 1-200 printable characters")
    return name


def create_key(db: Database, tenant_name: str, *, is_admin: bool = False) -> tuple[str, str]:
    """Create a key for a tenant (created if new). Returns (key, tenant_id); the key is not
    stored and cannot be shown again."""
    key, tenant_id, _ = create_key_with_id(db, tenant_name, is_admin=is_admin)
    return key, tenant_id


def create_key_with_id(
    db: Database, tenant_name: str, *, is_admin: bool = False
) -> tuple[str, str, str]:
    """`create_key`, also returning the new key's id (key, tenant_id, key_id)."""
    tenant_name = validate_tenant_name(tenant_name)
    key = new_key()
    with db.write() as session:
        tenant = key_rows.tenant(session, tenant_name, create=True)
        row = key_rows.add(session, tenant.id, hash_key(key), prefix_of(key), is_admin=is_admin)
        tenant_id, key_id = tenant.id, row.id
    log.info("api key created for tenant %s", tenant_id)
    return key, tenant_id, key_id


def ensure_admin_key(db: Database, configured: str | None) -> str | None:
    try:
        return _ensure_admin_key(db, configured)
    except IntegrityError:
        # Another process (the API and workers start together) got there first.
        return _ensure_admin_key(db, configured)


def _ensure_admin_key(db: Database, configured: str | None) -> str | None:
    """Make sure an admin key exists. A configured key is registered (by its hash) and replaces
    the service's earlier admin keys: the one configured before and the one generated at first
    start are revoked (admin keys made through the API stay). Without one, and with no live
    admin key yet, one is generated and returned so the caller can hand it over once."""
    with db.write() as session:
        tenant = key_rows.tenant(session, ADMIN_TENANT, create=True)
        if configured:
            if len(configured) < MIN_CONFIGURED_CHARS:
                raise Invalid(f"the admin key must be at least {MIN_CONFIGURED_CHARS} characters")
            digest = hash_key(configured)
            row = key_rows.by_hash(session, digest)
            if row is None:
                row = key_rows.add(session, tenant.id, digest, CONFIGURED, is_admin=True)
            elif row.tenant_id == tenant.id and row.is_admin:
                row.prefix = CONFIGURED  # rows from before kept its first characters
                if row.revoked_at is not None:
                    log.warning("the configured admin key had been revoked; it is live again")
                    row.revoked_at = None
            revoked = _revoke_bootstrap_keys(session, tenant.id, keep=row.id)
            if revoked:
                log.info("configured admin key in place; %d earlier admin keys revoked", revoked)
            return None
        if key_rows.live_admin_exists(session):
            return None
        key = new_key(BOOTSTRAP)
        key_rows.add(session, tenant.id, hash_key(key), prefix_of(key), is_admin=True)
        return key


def _revoke_bootstrap_keys(session: Session, tenant_id: str, *, keep: str) -> int:
    """Revoke the admin tenant's keys the service set up itself (configured or generated at
    first start), but `keep`. Rows from before these were marked: a prefix that is not a
    generated key's start was a configured key's, and the tenant's first key was made at
    first start."""
    rows = key_rows.of_tenant(session, tenant_id)  # oldest first, revoked ones included
    first = rows[0].id if rows else None
    count = 0
    for row in rows:
        own = row.prefix == CONFIGURED or row.prefix.startswith(BOOTSTRAP)
        legacy_configured = not row.prefix.startswith("rag_")
        if row.id == keep or not row.is_admin:
            continue
        if own or legacy_configured or row.id == first:
            if legacy_configured:
                row.prefix = CONFIGURED
            if row.revoked_at is None:
                row.revoked_at = time.time()
                count += 1
    return count


def save_admin_key(data_dir: Path, key: str) -> Path:
    """Write a generated admin key to `<data_dir>/admin-key`, readable by its owner only (never
    to a log), and return the path."""
    path = data_dir / ADMIN_KEY_FILE
    tmp = path.with_name(f".{ADMIN_KEY_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def bearer_key(authorization: str | None) -> str | None:
    """The key of a well-formed `Bearer <key>` header, else None."""
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def bearer(authorization: str | None) -> str:
    """The key of a `Bearer <key>` header, or Unauthorized saying what is wrong."""
    if not authorization:
        raise Unauthorized("missing Authorization header: use 'Authorization: Bearer <key>'")
    key = bearer_key(authorization)
    if key is None:
        raise Unauthorized("Authorization header must be 'Bearer <key>'")
    return key


class KeyCache:
    """Keys resolved in the last `ttl_s` seconds, by hash, so that a burst of searches does
    not go to the database (and through a worker thread) once per request to authenticate.

    Only keys that resolved are kept: a key created a moment ago works at once, and made-up
    keys cannot fill the cache. A key revoked through this process is dropped at once; one
    revoked through another replica stops working here within `ttl_s`. `ttl_s` 0 turns the
    cache off.

    It remembers, without expiry, the tenant of each key that resolved here (`tenant_of`),
    for counting a tenant's requests in progress before the key is checked again
    (rag.api.limits.TenantRequests); never for letting a request in.

    It also remembers the prefixes of keys that resolved (`line_of`): a lookup that misses
    the cache waits in its key's own line of the lookup pool when its prefix is known, and
    in one line for every unknown key otherwise, so a flood of made-up keys waits behind
    itself, never in front of a valid key.
    """

    MAX_ENTRIES = 10_000
    UNKNOWN = "unknown keys"

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._prefixes: OrderedDict[str, None] = OrderedDict()
        self._tenants: OrderedDict[str, tuple[str, str]] = OrderedDict()  # (tenant, key id)

    def get(self, authorization: str | None) -> Principal | None:
        """The principal of a well-formed header whose key resolved recently, else None (the
        caller then authenticates against the database, which also explains what is wrong)."""
        key = bearer_key(authorization) if self._entries else None
        if key is None:
            return None
        hit = self._entries.get(hash_key(key))
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of this header's key if that key has resolved here, however long ago
        (the key may have been revoked since: the key check still says)."""
        key = bearer_key(authorization) if self._tenants else None
        if key is None:
            return None
        hit = self._tenants.get(hash_key(key))
        return None if hit is None else hit[0]

    def line_of(self, authorization: str | None) -> str:
        """The lookup pool's line for this header: its key's prefix when a key with that
        prefix has resolved here, else the one line of unknown keys."""
        key = bearer_key(authorization)
        if key is None or prefix_of(key) not in self._prefixes:
            return self.UNKNOWN
        return "key " + prefix_of(key)

    def put(self, digest: str, principal: Principal, prefix: str | None = None) -> None:
        self._tenants[digest] = (principal.tenant_id, principal.key_id)
        self._tenants.move_to_end(digest)
        if len(self._tenants) > self.MAX_ENTRIES:
            self._tenants.popitem(last=False)
        if prefix is not None:
            self._prefixes[prefix] = None
            self._prefixes.move_to_end(prefix)
            if len(self._prefixes) > self.MAX_ENTRIES:
                self._prefixes.popitem(last=False)
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[digest] = (time.monotonic() + self.ttl_s, principal)

    def forget(self, key_id: str) -> None:
        for digest, (_, known) in list(self._tenants.items()):
            if known == key_id:
                del self._tenants[digest]
        for digest, (_, principal) in list(self._entries.items()):
            if principal.key_id == key_id:
                self._entries.pop(digest, None)


def authenticate(
    db: Database, authorization: str | None, cache: KeyCache | None = None
) -> Principal:
    key = bearer(authorization)
    digest = hash_key(key)
    with db.connect() as conn:  # a prebuilt statement, no ORM
        row = key_rows.live_by_hash(conn, digest)
    # The lookup is by hash; compare again in constant time for good measure.
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        raise Unauthorized("invalid API key")
    principal = Principal(row.tenant_id, row.tenant_name, row.is_admin, row.key_id)
    if cache is not None:
        cache.put(digest, principal, prefix_of(key))
    return principal


def revoke_key(db: Database, key_id: str, cache: KeyCache | None = None) -> bool:
    """Revoke a key: from now on it authenticates nothing. False if there is no such live
    key."""
    with db.write() as session:
        if not key_rows.revoke(session, key_id):
            return False
    if cache is not None:
        cache.forget(key_id)
    return True


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        # Only key management is admin-only; everything else is tenant-scoped.
        raise Forbidden("this operation needs an admin key")
