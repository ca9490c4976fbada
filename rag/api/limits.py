"""Refuse what is over a limit before it costs anything: bodies over the route's size while
they stream in, and a tenant's requests past the number it may have in the service at once.

Each route gets the limit it needs: the upload route the upload limit, every other route a
small JSON limit (`api.max_json_body_kb`), so a 50 MB body sent to /search is refused after
its first megabyte instead of being read and parsed. FastAPI reads and parses a JSON body
before it runs the route's dependencies (the key check among them); a request under /v1 that
carries a body but no `Bearer` key at all is refused here, before a byte of it is read.

`TenantRequests` holds each tenant to `api.tenant_requests` requests in the service at once.
Each request costs the event loop its parsing, routing and key check before it reaches a
bounded pool, and a burst of hundreds from one tenant (300 long polls at once) held every
other tenant's requests behind them for as long as that takes. Past the bound, a request is
answered 429 here, for the price of reading its headers.

It also paces the tenant's refusals: a 429 from further in (a full line for threads, the
engine's queue) costs the event loop the request's parsing, routing and key check, and a
client that sends again at once, on each of its 64 connections, got hundreds a second and
held the loop as long as it liked. Past a second's burst, a tenant's next 429 waits its turn
(`api.advanced.refusals_per_s`), still counted among its requests in progress; the waiting
costs nothing, and a client that honours Retry-After never meets it.

Requests outside /v1 need no key (/healthz, /readyz, /metrics, the console): 32 connections
of /readyz sent back to back held the loop with nothing to count them by. They are paced by
the client's address instead (`api.advanced.probes_per_s`, far above what a prober or a
browser sends): past the burst, the next waits its turn before it is read.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.auth import KeyCache, bearer
from rag.errors import TooLarge, Unauthorized

_NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS")


class BodyLimit:
    """Pure ASGI middleware: 413 at once for a declared Content-Length over the route's
    limit, and TooLarge raised from `receive` as soon as a streamed body passes it.

    `larger` lists (method, path pattern, limit) for routes allowed more than `max_bytes`."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        larger: Sequence[tuple[str, re.Pattern[str], int]] = (),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = tuple(larger)

    def limit(self, method: str, path: str) -> int:
        for m, pattern, limit in self.larger:
            if m == method and pattern.fullmatch(path):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _NO_BODY:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"].startswith("/v1/"):
            # Every /v1 route needs a key: say so before the body is read (the route would
            # say the same after reading it).
            try:
                bearer(_latin1(headers.get(b"authorization")))
            except Unauthorized as exc:
                await _reply(send, 401, exc.code, exc.message, {b"www-authenticate": b"Bearer"})
                return
        max_bytes = self.limit(scope["method"], scope["path"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await _reply(send, 413, "too_large", _too_large(max_bytes))
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise TooLarge(_too_large(max_bytes))
            return message

        await self.app(scope, limited, send)


class Pace:
    """When the next of a key's requests (a tenant's refusals, an address's requests without a
    key) may go on: `per_s` a second, after a burst of as many (the generic cell rate
    algorithm: one due time per key)."""

    # Keys remembered before those whose requests have all gone on are dropped; the next drop
    # waits for twice as many as a drop kept, so that many live keys are not read each time.
    MAX_KEYS = 4096

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / per_s
        self.burst_s = max(per_s - 1.0, 0.0) * self.interval
        self.clock = clock
        self._due: dict[str, float] = {}
        self._drop_at = self.MAX_KEYS

    def delay(self, key: str) -> float:
        """Seconds this request of `key` waits before it goes on; counts it."""
        now = self.clock()
        due = max(self._due.get(key, now), now)
        self._due[key] = due + self.interval
        if len(self._due) > self._drop_at:
            self._due = {k: d for k, d in self._due.items() if d > now}
            self._drop_at = max(self.MAX_KEYS, 2 * len(self._due))
        return max(0.0, due - self.burst_s - now)


class TenantRequests:
    """Pure ASGI middleware: at most `limit` requests under /v1 of one tenant at once; the
    next is answered 429 (with Retry-After) before it is read, routed or authenticated. A 429
    from inside waits its turn in `pace` before it is sent.

    The tenant is known without the database from the key cache (`key_cache()`: a key that
    has resolved here before); a request whose key never has is not counted, and meets the
    key-lookup pool's own bounds instead (rag.api.pools)."""

    def __init__(
        self, app: ASGIApp, limit: int, key_cache: Callable[[], KeyCache | None],
        refusals_per_s: float = 10.0, probes_per_s: float = 200.0,
    ) -> None:  # fmt: skip
        self.app = app
        self.limit = limit
        self.key_cache = key_cache
        self.pace = Pace(refusals_per_s)
        self.probes = Pace(probes_per_s)  # requests outside /v1, by client address
        self.running: dict[str, int] = {}

    def tenant(self, scope: Scope) -> str | None:
        cache = self.key_cache()
        if cache is None:
            return None
        for name, value in scope["headers"]:
            if name == b"authorization":
                return cache.tenant_of(value.decode("latin-1"))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = None
        if scope["type"] == "http":
            if not scope["path"].startswith("/v1/"):
                client = scope.get("client")
                wait = self.probes.delay(client[0] if client else "")
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.app(scope, receive, send)
                return
            tenant = self.tenant(scope)
        if tenant is None:
            await self.app(scope, receive, send)
            return
        running = self.running.get(tenant, 0)
        if running >= self.limit:
            message = (
                f"this key's tenant already has {self.limit} requests in progress; "
                "try again when one has finished"
            )
            close = scope["method"] not in _NO_BODY  # its body was not read
            await _reply(send, 429, "overloaded", message, {b"retry-after": b"1"}, close=close)
            return
        self.running[tenant] = running + 1

        async def paced(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 429:
                wait = self.pace.delay(tenant)
                if wait > 0:
                    await asyncio.sleep(wait)
            await send(message)

        try:
            await self.app(scope, receive, paced)
        finally:
            running = self.running[tenant] - 1
            if running:
                self.running[tenant] = running
            else:
                del self.running[tenant]


def path_pattern(template: str) -> re.Pattern[str]:
    """A route template ("/v1/collections/{collection_id}/documents") as a path regex."""
    parts = re.split(r"\{[^}/]+\}", template)
    return re.compile("[^/]+".join(re.escape(p) for p in parts))


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _too_large(limit: int) -> str:
    return f"request body is larger than the {limit} byte limit of this route"


async def _reply(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: dict[bytes, bytes] | None = None,
    *,
    close: bool = True,
) -> None:
    payload = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *([(b"connection", b"close")] if close else []),
                *(headers or {}).items(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
