"""The parser child gets a bare environment: never the service's secrets."""

from __future__ import annotations

import json

import pytest

from ingest.isolate import parse_isolated
from ingest.parse import ParseLimits
from rag.upload.formats import TEXT


def test_the_parser_child_sees_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "RAG_AUTH__ADMIN_KEY": "an-admin-key-of-some-length",
        "RAG_DATABASE__URL": "postgresql+psycopg://rag:hunter2@db/rag",
        "RAG_ENGINE__REMOTE_API_KEY": "sk-remote",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "OPENAI_API_KEY": "sk-openai",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    parsed = parse_isolated(
        b"x", TEXT, ParseLimits(timeout_s=20), parse_fn="tests.support.parsers:report_environment"
    )
    env = json.loads(parsed.text)
    assert not [name for name in env if name.startswith("RAG_")]
    for value in secrets.values():
        assert value not in json.dumps(env)
    # What it needs to run is there.
    assert env["PATH"] and env["LANG"] == "C.UTF-8"
    assert set(env) <= {
        "PATH", "HOME", "TMPDIR", "TEMP", "TMP", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
        "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "SYSTEMROOT", "PYTHONDONTWRITEBYTECODE",
        "PYTHONNOUSERSITE",
    }  # fmt: skip
