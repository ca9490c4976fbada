"""Snapshot generations of one collection's index on disk.

    <data_dir>/indexes/<collection_id>/gen-<N>/manifest.json + the index's own files

A generation is written into a temporary directory, every file fsynced, the directory renamed
to gen-<N> and the parent fsynced, so a crash leaves either a whole generation or a temporary
directory that loading ignores. The manifest names the embedding model and dimension, the
index kind and parameters, the watermark (the last change-log seq included), the count and the
sha256 of every file. Loading refuses a generation whose checksums, model or dimension do not
match (with a warning) and falls back to the one before.

Deletes reach the files too (the purge, rag.index.manager): a generation is written only after
the removed vectors were erased from the index (`erased_to` in its manifest), and a generation
older than a removal is deleted, as is every generation of a deleted collection, and a
temporary directory a crashed writer left behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.index import load_index
from rag.index.base import VectorIndex

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
KEEP = 2
_GEN = re.compile(r"^gen-(\d+)$")
_TMP_PREFIX = ".tmp-"
# A temporary directory untouched this long belongs to a writer that died.
ABANDONED_S = 300.0


@dataclass(frozen=True)
class Manifest:
    collection_id: str
    embedding_model: str
    embedding_dim: int
    kind: str
    params: dict[str, Any]
    watermark: int
    count: int
    files: dict[str, str]  # file name -> sha256
    generation: int = 0
    created_at: float = field(default_factory=time.time)
    format: int = 1
    # The change-log seq up to which removed vectors were erased before the index was saved
    # (0: a generation written before erasure existed, which may hold tombstoned vectors).
    erased_to: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(**data)


class SnapshotRefused(Exception):
    """A generation that must not be served (corrupt, truncated, another model)."""


@dataclass(frozen=True)
class Loaded:
    index: VectorIndex
    manifest: Manifest
    path: Path


class SnapshotStore:
    """The generations of one collection."""

    def __init__(self, data_dir: Path, collection_id: str, *, keep: int = KEEP) -> None:
        self.collection_id = collection_id
        self.root = Path(data_dir) / "indexes" / collection_id
        self.keep = keep

    def generations(self) -> list[int]:
        """Generation numbers on disk, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _GEN.match(entry.name)
            if match and entry.is_dir():
                found.append(int(match.group(1)))
        return sorted(found, reverse=True)

    def path_of(self, generation: int) -> Path:
        return self.root / f"gen-{generation}"

    # ------------------------------------------------------------------------------ write

    def write(
        self,
        index: VectorIndex,
        *,
        embedding_model: str,
        watermark: int,
        erased_to: int = 0,
    ) -> Manifest:
        """Write `index` as a new generation; the caller keeps it from changing meanwhile."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            index.save(tmp)
            files = {}
            for entry in sorted(tmp.iterdir()):
                files[entry.name] = _sha256(entry)
                _fsync_file(entry)
            count = len(index)
            for _attempt in range(100):
                generation = max(self.generations(), default=0) + 1
                manifest = Manifest(
                    collection_id=self.collection_id,
                    embedding_model=embedding_model,
                    embedding_dim=index.dim,
                    kind=index.kind,
                    params=dict(index.params),
                    watermark=watermark,
                    count=count,
                    files=files,
                    generation=generation,
                    erased_to=erased_to,
                )
                _write_manifest(tmp / MANIFEST, manifest)
                _fsync_dir(tmp)
                try:
                    # Fails if another process took this number first: take the next.
                    os.rename(tmp, self.path_of(generation))
                except OSError:
                    if self.path_of(generation).exists():
                        continue
                    raise
                break
            else:  # pragma: no cover - a hundred writers racing
                raise RuntimeError(f"could not claim a generation under {self.root}")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_dir(self.root)
        log.info(
            "index snapshot %s gen %d: %s, %d vectors, watermark %d",
            self.collection_id,
            generation,
            index.kind,
            count,
            watermark,
        )
        self.prune()
        return manifest

    def prune(self) -> None:
        """Keep the newest `keep` generations; drop older ones and stray temporaries."""
        for generation in self.generations()[self.keep :]:
            shutil.rmtree(self.path_of(generation), ignore_errors=True)
        if self.root.is_dir():
            cutoff = time.time() - ABANDONED_S
            for entry in self.root.iterdir():
                if entry.name.startswith(_TMP_PREFIX) and _last_write(entry) < cutoff:
                    shutil.rmtree(entry, ignore_errors=True)

    def watermarks(self) -> dict[int, int]:
        """generation -> its manifest's watermark (-1 when the manifest is unreadable)."""
        out = {}
        for generation in self.generations():
            try:
                text = (self.path_of(generation) / MANIFEST).read_text()
                out[generation] = int(json.loads(text)["watermark"])
            except (OSError, ValueError, KeyError, TypeError):
                out[generation] = -1
        return out

    def drop_older_than(self, watermark: int) -> list[int]:
        """Delete every generation whose watermark is below `watermark` (they may hold what
        a later change removed); returns their numbers."""
        dropped = [g for g, w in self.watermarks().items() if w < watermark]
        for generation in dropped:
            shutil.rmtree(self.path_of(generation), ignore_errors=True)
        if dropped:
            log.info(
                "index snapshots %s: dropped generations %s (older than a removal)",
                self.collection_id,
                sorted(dropped),
            )
            _fsync_dir(self.root)
        self.prune()
        return dropped

    def remove_all(self) -> None:
        """Every generation and temporary of the collection (it was deleted)."""
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
            log.info("index snapshots %s: removed (collection deleted)", self.collection_id)

    # ------------------------------------------------------------------------------- read

    def verify(self, generation: int, *, embedding_model: str, dim: int) -> Manifest:
        path = self.path_of(generation)
        try:
            manifest = Manifest.from_json((path / MANIFEST).read_text())
        except (OSError, ValueError, TypeError) as exc:
            raise SnapshotRefused(f"unreadable manifest: {exc}") from exc
        if manifest.collection_id != self.collection_id:
            raise SnapshotRefused(f"manifest names collection {manifest.collection_id}")
        if manifest.embedding_model != embedding_model or manifest.embedding_dim != dim:
            raise SnapshotRefused(
                f"built with {manifest.embedding_model} ({manifest.embedding_dim}-d), "
                f"serving {embedding_model} ({dim}-d)"
            )
        on_disk = {p.name for p in path.iterdir()} - {MANIFEST}
        if on_disk != set(manifest.files):
            raise SnapshotRefused(f"files {sorted(on_disk)} != manifest {sorted(manifest.files)}")
        for name, digest in manifest.files.items():
            if _sha256(path / name) != digest:
                raise SnapshotRefused(f"checksum mismatch in {name}")
        return manifest

    def load_latest(self, *, embedding_model: str, dim: int) -> Loaded | None:
        """The newest generation that verifies and loads, or None."""
        for generation in self.generations():
            path = self.path_of(generation)
            try:
                manifest = self.verify(generation, embedding_model=embedding_model, dim=dim)
                index = load_index(path)
                if index.kind != manifest.kind or len(index) != manifest.count:
                    raise SnapshotRefused(
                        f"loaded {index.kind} with {len(index)} vectors, manifest says "
                        f"{manifest.kind} with {manifest.count}"
                    )
            except Exception as exc:  # any failure means: not this one, try the previous
                log.warning(
                    "index snapshot %s gen %d refused: %s", self.collection_id, generation, exc
                )
                continue
            return Loaded(index, manifest, path)
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(path: Path, manifest: Manifest) -> None:
    with open(path, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def collections_on_disk(data_dir: Path) -> list[str]:
    """Collection ids that have a snapshot directory under `data_dir`."""
    root = Path(data_dir) / "indexes"
    if not root.is_dir():
        return []
    return sorted(entry.name for entry in root.iterdir() if entry.is_dir())


def _last_write(path: Path) -> float:
    """The newest modification time of a directory and what is in it."""
    times = [path.stat().st_mtime]
    for entry in path.rglob("*"):
        try:
            times.append(entry.stat().st_mtime)
        except OSError:
            continue
    return max(times)
