"""The CLI finds the service's data from any folder, and says where it looked."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from rag.cli import build_parser
from rag.cli.common import data_settings, record_serve
from rag.config import Settings
from rag.embed import HashEmbedder
from tests.conftest import Api


def _clean_env(monkeypatch: pytest.MonkeyPatch, home: Path, cwd: Path) -> None:
    for name in ("RAG_DATA_DIR", "RAG_DATABASE__URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAG_EMBED__BACKEND", "hash")
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")
    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)


def test_from_another_folder_the_cli_uses_the_servers_data(
    make_api: Callable[..., Api],
    hash_embedder: HashEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "service" / "data"
    url = f"sqlite:///{data / 'rag.db'}"
    api = make_api(url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a, name="handbook")
    _clean_env(monkeypatch, tmp_path / "home", tmp_path / "elsewhere")
    # What `rag serve` records at start, from its own settings.
    record_serve(Settings(data_dir=data, database={"url": url}), "http://127.0.0.1:8000")
    docs = tmp_path / "elsewhere" / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The ferry leaves from pier four at nine.")

    settings = data_settings()
    assert settings.database_url == url
    args = build_parser().parse_args(["ingest", str(docs), "--collection", "handbook"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert f"accepted 1 of 1 files into {cid}" in out.out
    assert "using the data of the server" in out.err
    # Nothing was created in the folder it ran from.
    assert not (tmp_path / "elsewhere" / "data").exists()

    # A collection that is not there: the message says which database was searched.
    args = build_parser().parse_args(["ingest", str(docs), "--collection", "nope"])
    with pytest.raises(SystemExit) as exc:
        args.func(args)
    assert "no collection 'nope'" in str(exc.value) and str(data / "rag.db") in str(exc.value)


def test_without_any_data_it_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch, tmp_path / "home", tmp_path / "empty")
    args: argparse.Namespace = build_parser().parse_args(
        ["ask", "handbook", "When does the ferry leave?"]
    )
    with pytest.raises(SystemExit) as exc:
        args.func(args)
    message = str(exc.value)
    assert "no ragserve database in" in message and str(tmp_path / "empty") in message
    assert "--url" in message
    assert not (tmp_path / "empty" / "data").exists()  # no empty database left behind
