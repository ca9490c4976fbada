"""`rag ingest PATH... --collection NAME --wait` through the service layer."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from rag.cli import ingest as ingest_cli
from rag.embed import HashEmbedder
from tests.conftest import Api


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rag")
    ingest_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_ingest_a_folder_and_wait(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: HashEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = make_api(sqlite_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a, name="notes")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("The ferry leaves from pier four at nine.")
    (folder / "sub" / "b.md").write_text("# Tides\n\nTide tables are printed monthly.")
    (folder / "c.html").write_text("<html><body><p>Storm warnings on channel 16.</p></body></html>")
    (folder / "skip.bin").write_bytes(b"\x00\x01")
    (folder / "fake.pdf").write_text("not a pdf at all")  # refused as spoofing, reported
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("RAG_DATABASE__URL", sqlite_url)
    monkeypatch.setenv("RAG_EMBED__BACKEND", "hash")
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")
    monkeypatch.setenv("RAG_INGEST__ADVANCED__POLL_INTERVAL_S", "0.05")
    args = _parse(["ingest", str(folder), "--collection", "notes", "--wait"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert f"accepted 3 of 4 files into {cid}" in captured.out
    assert "3 done" in captured.out
    assert "fake.pdf" in captured.err
    # The two progress bars, on stderr: uploading the files, then indexing them.
    assert "upload: 100%" in captured.err and "4/4" in captured.err
    assert "index: 100%" in captured.err and "3/3" in captured.err
    docs = api.client.get(f"/v1/collections/{cid}/documents", headers=api.a).json()
    names = sorted((d["filename"], d["status"]) for d in docs["documents"])
    assert names == [("a.txt", "indexed"), ("b.md", "indexed"), ("c.html", "indexed")]
    # Again: the same bytes are the same documents, nothing new to wait for.
    args = _parse(["ingest", str(folder / "a.txt"), "--collection", cid])
    assert args.func(args) == 0
    assert "accepted 0 of 1 files" in capsys.readouterr().out
