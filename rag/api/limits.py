"""Refuse oversized request bodies while they stream in, before they are all in memory.

Each route gets the limit it needs: the upload route the upload limit, every other route a
small JSON limit (`api.max_json_body_kb`), so a 50 MB body sent to /search is refused after
its first megabyte instead of being read and parsed. FastAPI reads and parses a JSON body
before it runs the route's dependencies (the key check among them); a request under /v1 that
carries a body but no `Bearer` key at all is refused here, before a byte of it is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.auth import bearer
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


def path_pattern(template: str) -> re.Pattern[str]:
    """A route template ("/v1/collections/{collection_id}/documents") as a path regex."""
    parts = re.split(r"\{[^}/]+\}", template)
    return re.compile("[^/]+".join(re.escape(p) for p in parts))


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _too_large(limit: int) -> str:
    return f"request body is larger than the {limit} byte limit of this route"


async def _reply(
    send: Send, status: int, code: str, message: str, headers: dict[bytes, bytes] | None = None
) -> None:
    payload = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
                *(headers or {}).items(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
