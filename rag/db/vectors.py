"""How a chunk's vector is stored: float32, little-endian, `dim` values, L2-normalised.

The one owner of the format: ingest writes with `encode`, the indexes read with `decode_rows`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

DTYPE = "<f4"


def encode(vector: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(vector, dtype=DTYPE).tobytes()


def encode_rows(vectors: npt.NDArray[np.float32]) -> list[bytes]:
    rows = np.ascontiguousarray(vectors, dtype=DTYPE)
    return [row.tobytes() for row in rows]


def decode(blob: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(blob, dtype=DTYPE)


def decode_rows(
    rows: Iterable[tuple[int, bytes]], dim: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """(chunk id, blob) rows as an id array and a [n, dim] matrix; a blob of another
    dimension is skipped with a warning (it cannot be in an index of this dimension)."""
    ids: list[int] = []
    vectors: list[np.ndarray[Any, Any]] = []
    for chunk_id, blob in rows:
        vector = decode(blob)
        if vector.shape[0] != dim:
            log.warning("chunk %d has a %d-d embedding; skipped", chunk_id, vector.shape[0])
            continue
        ids.append(int(chunk_id))
        vectors.append(vector)
    if not ids:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    return np.array(ids, dtype=np.int64), np.vstack(vectors).astype(np.float32)
