"""An app served by uvicorn on a free loopback port, in a thread of this process.

For tests and benchmarks that need real HTTP (streaming, concurrent clients, the official
`openai` client) without a separate process.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    def __init__(self, app: Any, *, start_timeout_s: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
            lifespan="on",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/healthz", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
