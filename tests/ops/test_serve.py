"""`rag serve` as a user runs it: a process on a port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from rag.api.loopback import free_port

ROOT = Path(__file__).resolve().parents[2]

GET = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A `rag serve` process (no models, no worker); yields its port."""
    tmp_path = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),  # where `rag serve` notes its address
        "RAG_DATA_DIR": str(tmp_path / "data"),
        "RAG_EMBED__BACKEND": "hash",
        "RAG_ENGINE__LOAD_AT_START": "false",
        "RAG_INGEST__IN_PROCESS_WORKER": "false",
        "RAG_LOG_LEVEL": "WARNING",
    }
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "serve", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "rag serve did not start"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_an_idle_connection_outlives_the_clients_own_keep_alive(served: int) -> None:
    """A client keeps an idle connection for a while (httpx: 5 s) and then sends on it; a
    server that closed it first loses that request. The server's keep-alive is the longer."""
    with socket.create_connection(("127.0.0.1", served), timeout=10) as sock:
        sock.sendall(GET)
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6)  # past uvicorn's own default of 5 s, and httpx's
        sock.sendall(GET)
        assert _answer(sock).startswith(b"HTTP/1.1 200")


def test_the_compose_healthcheck_passes_on_a_serving_process_only(served: int) -> None:
    """docker-compose.yml's healthcheck of the api, run as Docker runs it (its port made the
    test server's): it succeeds against `rag serve` and fails where nothing listens."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    test = compose["services"]["api"]["healthcheck"]["test"]
    assert test[0] == "CMD", test
    probe = [a.replace(":8000/", f":{served}/") for a in test[1:]]
    assert probe != test[1:], "the healthcheck does not probe port 8000"
    probe[0] = sys.executable  # the image's python
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    dead = [a.replace(f":{served}/", f":{free_port()}/") for a in probe]
    assert subprocess.run(dead, capture_output=True, timeout=30).returncode != 0
