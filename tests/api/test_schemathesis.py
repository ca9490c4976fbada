"""The API keeps the contract /openapi.json states: schemathesis runs every check (status codes
and headers documented, bodies as declared, bounds enforced as stated, valid data accepted,
`Allow` on 405, ...) with its examples, coverage, fuzzing and stateful phases against the real
app on a loopback port, with 0 failures and 0 server errors.

The stateful phase really creates and deletes: the app has a throwaway data dir. Generation is
the fake generator (tests/answer/conftest.py), given a context no prompt fills: whether a prompt
and max_tokens fit a real model's context is the model's business, not the schema's. What a
schema cannot state is listed, per operation, in tests/api/schemathesis.toml."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag.api.app import create_app
from rag.embed import HashEmbedder
from rag.services import build_services
from tests.answer.conftest import FakeEngine
from tests.conftest import ADMIN, LiveServer, make_settings

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Cases per operation and phase: ~2,500 requests, well under a minute on 2 cores.
EXAMPLES = 50
SEED = 4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path / "throwaway", None)
    engine = FakeEngine(answer="The ferry leaves at nine [1].")
    engine.max_model_len = 1 << 20
    services = build_services(settings, embedder=HashEmbedder(384), engine=engine)
    with LiveServer(create_app(settings, services)) as live:
        yield live


@pytest.mark.slow
def test_schemathesis_finds_nothing(server: LiveServer, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    assert cli.exists(), "schemathesis is in the dev extra: pip install -e '.[dev]'"
    options = {
        "--checks": "all",
        "--header": f"Authorization:{ADMIN['Authorization']}",
        "--max-examples": str(EXAMPLES),
        "--seed": str(SEED),
        "--workers": "1",
        "--phases": "examples,coverage,fuzzing,stateful",
        "--report": "junit",
        "--report-junit-path": str(tmp_path / "junit.xml"),
    }
    args = [str(cli), "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json"]
    for name, value in options.items():
        args += [name, value]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-20_000:]
    assert " passed" in out and "failures" not in out.rsplit("SUMMARY", 1)[-1], out[-5_000:]
    report = (tmp_path / "junit.xml").read_text()
    assert 'failures="0"' in report and 'errors="0"' in report, report[:2000]
