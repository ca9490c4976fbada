"""Refuse oversized request bodies while they stream in, before they are all on disk."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.errors import TooLarge


class BodyLimit:
    """Pure ASGI middleware: 413 at once for a declared Content-Length over the limit, and
    TooLarge raised from `receive` as soon as a streamed body passes it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _reply_413(send, self.max_bytes)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise TooLarge(f"request body is larger than the {self.max_bytes} byte limit")
            return message

        await self.app(scope, limited, send)


async def _reply_413(send: Send, limit: int) -> None:
    payload = json.dumps(
        {
            "error": {
                "code": "too_large",
                "message": f"request body is larger than the {limit} byte limit",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
