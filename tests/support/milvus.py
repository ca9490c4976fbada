"""`milvus-lite server` on a free loopback port in a temporary folder, for the tests that
speak to Milvus: the same gRPC API, connected by URI exactly as to a Milvus cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def milvus_lite_command() -> list[str] | None:
    """How to start the server, or None when milvus-lite is not installed."""
    exe = Path(sys.executable).with_name("milvus-lite")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("milvus-lite")
    return [found] if found else None


class MilvusLiteServer:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "milvus-lite.log"

    def start(self, command: list[str], timeout_s: float = 60.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    *command,
                    "server",
                    "--data-dir",
                    str(self.data_dir),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"milvus-lite server exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"milvus-lite server did not listen on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="session")
def milvus_uri() -> Iterator[str]:
    """The URI of a Milvus Lite server shared by the session's tests (each test uses
    collections of its own). Skipped when milvus-lite is not installed, failed in CI."""
    command = milvus_lite_command()
    if command is None:
        reason = "milvus-lite is not installed (pip install -e '.[dev]' brings it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="ragserve-milvus-"))
    server = MilvusLiteServer(root / "data")
    try:
        server.start(command)
        yield server.uri
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def milvus_engine(milvus_uri: str) -> Iterator[object]:
    """One client for the session's direct index tests (rag.index.milvus.MilvusEngine)."""
    from rag.config import MilvusSettings
    from rag.index.milvus import MilvusEngine

    engine = MilvusEngine(MilvusSettings(uri=milvus_uri, collection_prefix="contract"))
    yield engine
    engine.close()
