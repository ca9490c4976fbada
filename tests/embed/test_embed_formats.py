"""Query formats with the real model: int8 vectors close to float32's, the format chosen by
settings, and float32 when int8 cannot be built or strays.

Tolerance: on docfaq's 322 queries int8 came out at cosine >= 0.981 of float32's (mean 0.995);
here every text must reach 0.97 (the bound the encoder itself checks at build) and the mean
0.985."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rag.config import EmbedAdvanced, EmbedSettings
from rag.embed import SentenceTransformerEmbedder, build_embedder
from rag.embed.onnx import AUTO_FORMAT, SPINNING, OnnxQueryEncoder

TEXTS = [
    "what is a closure in perl",
    "rome",
    "How do I make an executable from a Python script?",
    "the longest river in europe flows through ten countries and four capitals " * 6,
    "SELECT id FROM chunks WHERE collection_id = ? ORDER BY id",
]


@pytest.fixture(scope="module")
def int8(minilm: SentenceTransformerEmbedder) -> OnnxQueryEncoder:
    encoder = minilm.query_encoder("int8", threads=1)
    assert encoder is not None
    return encoder


def test_int8_vectors_are_close_to_float32(
    minilm: SentenceTransformerEmbedder, int8: OnnxQueryEncoder
) -> None:
    assert int8.format == "int8" and int8.fused
    f32 = minilm.query_encoder("float32", threads=1)
    assert f32 is not None and f32.format == "float32"
    a, b = int8(TEXTS), f32(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cosine = np.sum(a * b, axis=1)
    assert cosine.min() >= 0.97 and cosine.mean() >= 0.985, cosine
    # float32 through ONNX Runtime is the torch model's computation.
    np.testing.assert_allclose(b, minilm._encode(TEXTS), atol=1e-5)
    # A query's int8 vector does not depend on the queries it is batched with.
    alone = np.vstack([int8([t]) for t in TEXTS])
    np.testing.assert_array_equal(alone, a)


def test_the_query_encoders_workers_sleep_between_queries(
    minilm: SentenceTransformerEmbedder, int8: OnnxQueryEncoder
) -> None:
    """Spinning, they kept a core busy after each query, when the engine's prefill starts."""
    f32 = minilm.query_encoder("float32", threads=2)
    assert f32 is not None
    for encoder in (int8, f32):
        options = encoder._session.get_session_options()
        assert options.get_session_config_entry(SPINNING) == "0"


def test_the_format_comes_from_settings(minilm: SentenceTransformerEmbedder) -> None:
    assert EmbedSettings().advanced.query_format == "auto"
    assert AUTO_FORMAT == "int8"
    # The session's shared embedder runs the default: auto, which is int8.
    minilm.embed(["warm the lane"])
    assert minilm.query_format == AUTO_FORMAT and minilm.query_format_used == "int8"

    plain = build_embedder(
        EmbedSettings(device="cpu", advanced=EmbedAdvanced(query_format="float32"))
    )
    assert isinstance(plain, SentenceTransformerEmbedder)
    try:
        got = plain.embed(["what is a closure in perl"])
        assert plain.query_format_used == "float32"
        np.testing.assert_allclose(got, minilm._encode(["what is a closure in perl"]), atol=1e-5)
    finally:
        plain.close()

    with pytest.raises(ValueError):
        EmbedAdvanced(query_format="openvino")  # type: ignore[arg-type]


def test_int8_that_cannot_be_built_falls_back_to_float32(
    minilm: SentenceTransformerEmbedder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rag.embed import quantize

    def broken(graph: bytes) -> bytes:
        raise RuntimeError("quantizer broke")

    monkeypatch.setattr(quantize, "quantize_int8", broken)
    with caplog.at_level(logging.WARNING, logger="rag.embed.onnx"):
        encoder = minilm.query_encoder("int8", threads=1)
    assert encoder is not None and encoder.format == "float32"
    assert "int8 quantization failed, using float32" in caplog.text
    np.testing.assert_allclose(encoder(TEXTS[:2]), minilm._encode(TEXTS[:2]), atol=1e-5)


def test_int8_that_strays_from_float32_is_not_used(
    minilm: SentenceTransformerEmbedder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rag.embed import quantize

    # Agreement never reaches the bound: as if int8 lost too much on this machine.
    monkeypatch.setattr(quantize, "MIN_COSINE", 1.01)
    with caplog.at_level(logging.WARNING, logger="rag.embed.onnx"):
        encoder = minilm.query_encoder("int8", threads=1)
    assert encoder is not None and encoder.format == "float32"
    assert "using float32" in caplog.text


def test_the_quantizer_leaves_the_root_logger_as_it_was(
    minilm: SentenceTransformerEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    """The quantizer logs every tensor on the root logger; those lines are dropped, others
    are not."""
    root = logging.getLogger()
    filters = list(root.filters)
    with caplog.at_level(logging.INFO):
        encoder = minilm.query_encoder("int8", threads=1)
        logging.getLogger().info("a line of our own")
    assert encoder is not None and encoder.format == "int8"
    assert root.filters == filters
    assert not [r for r in caplog.records if "onnxruntime" in r.pathname and r.name == "root"]
    assert "a line of our own" in caplog.text
