"""The vector codec (rag.db.vectors): float32 little-endian, and a row of another dimension
is skipped rather than breaking an index's build."""

from __future__ import annotations

import numpy as np

from rag.db import vectors


def test_vectors_round_trip_as_little_endian_float32() -> None:
    v = np.array([0.5, -1.25, 3.0], dtype=np.float64)
    blob = vectors.encode(v)  # type: ignore[arg-type]
    assert blob == np.array([0.5, -1.25, 3.0], dtype="<f4").tobytes()
    np.testing.assert_array_equal(vectors.decode(blob), v.astype(np.float32))
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert [vectors.decode(b).tolist() for b in vectors.encode_rows(rows)] == rows.tolist()


def test_decode_rows_skips_a_vector_of_another_dimension() -> None:
    a, b = np.ones(3, np.float32), np.zeros(4, np.float32)
    ids, matrix = vectors.decode_rows([(7, a.tobytes()), (8, b.tobytes()), (9, a.tobytes())], 3)
    assert ids.tolist() == [7, 9] and ids.dtype == np.int64
    assert matrix.shape == (2, 3) and matrix.dtype == np.float32
    ids, matrix = vectors.decode_rows([], 3)
    assert ids.shape == (0,) and matrix.shape == (0, 3)
