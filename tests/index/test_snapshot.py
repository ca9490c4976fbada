"""Snapshot generations: atomic writes, verified loads, fallback to the previous generation."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rag.index import Knobs, build_index
from rag.index import snapshot as snapshot_module
from rag.index.base import VectorIndex
from rag.index.snapshot import MANIFEST, SnapshotStore

DIM = 16
MODEL = "test-model"


def make_index(kind: str = "hnsw", n: int = 200, seed: int = 0) -> VectorIndex:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = build_index(kind, DIM)
    index.add(np.arange(n, dtype=np.int64), x)
    return index


def queries() -> np.ndarray:
    q = np.random.default_rng(9).standard_normal((5, DIM)).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def results(index: VectorIndex) -> list[list[int]]:
    return [h.ids.tolist() for h in index.search(queries(), Knobs(k=5))]


@pytest.mark.parametrize("kind", ["exact", "hnsw", "faiss_flat", "faiss_ivf", "faiss_hnsw"])
def test_round_trip(tmp_path: Path, kind: str) -> None:
    store = SnapshotStore(tmp_path, "col1")
    index = make_index(kind, n=1200)
    index.remove(np.arange(10, dtype=np.int64))
    manifest = store.write(index, embedding_model=MODEL, watermark=42)
    assert manifest.generation == 1
    assert store.path_of(1) == tmp_path / "indexes" / "col1" / "gen-1"
    on_disk = json.loads((store.path_of(1) / MANIFEST).read_text())
    assert on_disk["collection_id"] == "col1"
    assert on_disk["embedding_model"] == MODEL and on_disk["embedding_dim"] == DIM
    assert on_disk["kind"] == kind and on_disk["params"] == index.params
    assert on_disk["watermark"] == 42 and on_disk["count"] == 1190
    assert on_disk["files"] and all(len(h) == 64 for h in on_disk["files"].values())
    assert on_disk["created_at"] > 0
    loaded = store.load_latest(embedding_model=MODEL, dim=DIM)
    assert loaded is not None
    assert loaded.manifest == manifest
    assert results(loaded.index) == results(index)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]


def test_keeps_two_generations(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "col1")
    for watermark in range(1, 5):
        store.write(make_index("exact", seed=watermark), embedding_model=MODEL, watermark=watermark)
    assert store.generations() == [4, 3]
    loaded = store.load_latest(embedding_model=MODEL, dim=DIM)
    assert loaded is not None and loaded.manifest.watermark == 4


def test_crash_inside_write_keeps_previous_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path, "col1")
    first = make_index("hnsw", seed=1)
    store.write(first, embedding_model=MODEL, watermark=10)

    seen_tmp: list[Path] = []

    def boom(path: Path, manifest: object) -> None:
        # The index files are already in the temporary directory when this fails.
        seen_tmp.append(path.parent)
        assert any(path.parent.iterdir())
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_module, "_write_manifest", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write(make_index("hnsw", seed=2), embedding_model=MODEL, watermark=20)
    monkeypatch.undo()
    assert seen_tmp and not seen_tmp[0].exists()
    assert store.generations() == [1]
    # A restart (a fresh store) serves the previous generation.
    loaded = SnapshotStore(tmp_path, "col1").load_latest(embedding_model=MODEL, dim=DIM)
    assert loaded is not None and loaded.manifest.watermark == 10
    assert results(loaded.index) == results(first)


def test_process_killed_mid_save_keeps_previous_generation(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "col1")
    first = make_index("faiss_hnsw", seed=1)
    store.write(first, embedding_model=MODEL, watermark=10)
    # A child process writes the next generation and is SIGKILLed just before the rename:
    # no cleanup runs, the temporary directory stays behind.
    script = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from pathlib import Path
        from rag.index import build_index
        from rag.index import snapshot
        from rag.index.snapshot import SnapshotStore

        def die(path, manifest):
            path.write_text('{{"half": ')
            os.kill(os.getpid(), signal.SIGKILL)

        snapshot._write_manifest = die
        index = build_index("faiss_hnsw", {DIM})
        index.add(np.arange(5, dtype=np.int64), np.eye(5, {DIM}, dtype=np.float32))
        SnapshotStore(Path({str(tmp_path)!r}), "col1").write(
            index, embedding_model={MODEL!r}, watermark=99
        )
        """
    )
    repo_root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=120, cwd=repo_root
    )
    assert proc.returncode == -9, proc.stderr.decode()
    leftovers = [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the killed writer should have left its temporary directory"
    assert store.generations() == [1]
    loaded = SnapshotStore(tmp_path, "col1").load_latest(embedding_model=MODEL, dim=DIM)
    assert loaded is not None and loaded.manifest.watermark == 10
    assert results(loaded.index) == results(first)
    # The next write takes the next number and is unaffected by the leftover.
    assert store.write(first, embedding_model=MODEL, watermark=11).generation == 2


@pytest.mark.parametrize("damage", ["bit-flip", "truncate", "delete-file", "manifest"])
def test_corrupt_generation_refused_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    store = SnapshotStore(tmp_path, "col1")
    first = make_index("hnsw", seed=1)
    store.write(first, embedding_model=MODEL, watermark=10)
    store.write(make_index("hnsw", seed=2), embedding_model=MODEL, watermark=20)
    newest = store.path_of(2)
    target = newest / "hnsw.bin"
    if damage == "bit-flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete-file":
        target.unlink()
    else:
        (newest / MANIFEST).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="rag.index.snapshot"):
        loaded = store.load_latest(embedding_model=MODEL, dim=DIM)
    assert loaded is not None and loaded.manifest.generation == 1
    assert results(loaded.index) == results(first)
    assert any("gen 2 refused" in r.getMessage() for r in caplog.records)


def test_every_generation_corrupt_gives_none(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "col1")
    store.write(make_index("exact"), embedding_model=MODEL, watermark=1)
    path = store.path_of(1) / "vectors.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert store.load_latest(embedding_model=MODEL, dim=DIM) is None


def test_other_embedding_model_or_dim_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path, "col1")
    store.write(make_index("hnsw"), embedding_model=MODEL, watermark=1)
    with caplog.at_level(logging.WARNING, logger="rag.index.snapshot"):
        assert store.load_latest(embedding_model="other-model", dim=DIM) is None
        assert store.load_latest(embedding_model=MODEL, dim=DIM * 2) is None
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "other-model" in messages and "refused" in messages
    assert store.load_latest(embedding_model=MODEL, dim=DIM) is not None


def test_generation_of_another_collection_refused(tmp_path: Path) -> None:
    SnapshotStore(tmp_path, "col1").write(make_index("exact"), embedding_model=MODEL, watermark=1)
    (tmp_path / "indexes" / "col1").rename(tmp_path / "indexes" / "col2")
    assert SnapshotStore(tmp_path, "col2").load_latest(embedding_model=MODEL, dim=DIM) is None
