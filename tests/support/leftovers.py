"""Look for bytes that should be gone in every file of a data directory: a purged document's
words and vectors in the database files (rag.db, -wal, -shm) and index snapshots.

Used by the purge tests and by `bench/abuse.py` (`FIGURE purge_leftovers`); an operator can
run it to check an erasure:

    needles = document_needles(db, document_id, markers=["quokkazanzibar"])  # before delete
    ...delete, wait for the purge...
    assert leftover_bytes(scan(data_dir, needles)) == 0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from rag.db import Database
from rag.db.models import Chunk

# Vectors are looked for by a few windows of their bytes, so a vector that a page boundary
# splits (a long SQLite row) is still found; a sparse vector (mostly zero bytes, as the hash
# embedder's are) is looked for whole, since its windows could match anything.
_WINDOW = 64
_WINDOW_AT = (0, 512, 1024)
_READ = 8 << 20


@dataclass(frozen=True)
class Leftover:
    path: Path
    needle: bytes
    count: int


def word_needles(words: Iterable[str]) -> list[bytes]:
    """A distinctive word as a full-text index keeps it: lower-cased, and also past its first
    three letters, since FTS5 stores a term as the suffix after the prefix it shares with the
    term before it. Pick words no other document has, of 10 letters or more, that a stemmer
    leaves alone (not ending in -s, -ed, -ing, -ly...)."""
    out: list[bytes] = []
    for word in words:
        low = word.lower().encode()
        out += [word.encode(), low, low[3:]]
    return list(dict.fromkeys(n for n in out if len(n) >= 6))


def vector_needles(vectors: Iterable[bytes]) -> list[bytes]:
    """Windows of each stored vector's bytes (float32, little-endian, as SQL and the
    in-process indexes keep them)."""
    out: list[bytes] = []
    for blob in vectors:
        windows = [blob[a : a + _WINDOW] for a in _WINDOW_AT if a + _WINDOW <= len(blob)]
        dense = [w for w in windows if w.count(0) <= len(w) // 4]
        out += dense if len(dense) == len(windows) and dense else [blob]
    return list(dict.fromkeys(out))


def document_needles(db: Database, document_id: str, markers: Iterable[str] = ()) -> list[bytes]:
    """What to look for once `document_id` is purged: its chunks' vectors and the marker
    words given (read these before deleting it)."""
    with db.read() as session:
        blobs = list(
            session.scalars(select(Chunk.embedding).where(Chunk.document_id == document_id))
        )
    return word_needles(markers) + vector_needles(blobs)


def scan(root: Path | Iterable[Path], needles: Iterable[bytes]) -> list[Leftover]:
    """Every needle found in every file under `root` (or in the files given), with its
    count. Files are read in blocks that overlap by the longest needle."""
    wanted = [n for n in dict.fromkeys(needles) if n]
    if not wanted:
        return []
    paths = (
        sorted(p for p in Path(root).rglob("*") if p.is_file())
        if isinstance(root, Path)
        else list(root)
    )
    overlap = max(len(n) for n in wanted) - 1
    found: list[Leftover] = []
    for path in paths:
        counts = dict.fromkeys(wanted, 0)
        try:
            with open(path, "rb") as f:
                tail = b""
                while block := f.read(_READ):
                    data = tail + block
                    for needle in wanted:
                        # Matches wholly inside the carried-over tail were counted last time.
                        counts[needle] += data.count(needle) - tail.count(needle)
                    tail = data[-overlap:] if overlap else b""
        except OSError:  # removed while we looked (a snapshot being replaced)
            continue
        found += [Leftover(path, n, c) for n, c in counts.items() if c]
    return found


def leftover_bytes(found: Iterable[Leftover]) -> int:
    """The bytes of the needles found, counted once per occurrence."""
    return sum(len(item.needle) * item.count for item in found)
