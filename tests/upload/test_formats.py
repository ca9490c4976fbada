"""The format registry: every entry's parser imports, its sample is detected as that entry
by its bytes, by its extensions and by its declared types, and its parser reads the sample."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import docx
import pytest
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from ingest.parse import ParseLimits, parse
from rag.upload import formats
from rag.upload.detect import detect_media_type
from rag.upload.formats import DOCX, FORMATS, HTML, MARKDOWN, PDF, TEXT, Format


def _pdf() -> bytes:
    buf = io.BytesIO()
    pdf = canvas.Canvas(buf, pagesize=A4)
    pdf.drawString(72, 800, "A sample PDF page.")
    pdf.showPage()
    pdf.save()
    return buf.getvalue()


def _docx() -> bytes:
    document = docx.Document()
    document.add_paragraph("A sample document.")
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


# One per registered format; a new entry fails `test_every_format_has_a_sample` until it has one.
SAMPLES = {
    TEXT: lambda: b"A sample of plain text.\n",
    MARKDOWN: lambda: b"# A sample\n\n- one item\n- another\n",
    HTML: lambda: b"<!DOCTYPE html><html><body><p>A sample page.</p></body></html>",
    PDF: _pdf,
    DOCX: _docx,
}
BY_NAME = pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.media_type)


def test_every_format_has_a_sample() -> None:
    assert set(SAMPLES) == {f.media_type for f in FORMATS}


def test_media_types_and_extensions_are_unique() -> None:
    media_types = [f.media_type for f in FORMATS] + [a for f in FORMATS for a in f.aliases]
    assert len(media_types) == len(set(media_types))
    extensions = [ext for f in FORMATS for ext in f.extensions]
    assert len(extensions) == len(set(extensions))
    assert all(ext.startswith(".") and ext == ext.lower() for ext in extensions)


@BY_NAME
def test_parser_and_its_libraries_import(fmt: Format) -> None:
    assert callable(formats.load(fmt.parser))
    for name in fmt.preload:
        __import__(name)


@BY_NAME
def test_sample_is_detected_as_its_format(fmt: Format) -> None:
    data = SAMPLES[fmt.media_type]()
    assert detect_media_type(data, None, None) == fmt.media_type
    for ext in fmt.extensions:
        assert detect_media_type(data, "sample" + ext.upper(), None) == fmt.media_type
    for declared in (fmt.media_type, *fmt.aliases):
        assert detect_media_type(data, None, declared) == fmt.media_type


@BY_NAME
def test_parser_reads_its_sample(fmt: Format) -> None:
    parsed = parse(SAMPLES[fmt.media_type](), fmt.media_type, ParseLimits())
    assert "sample" in parsed.text
    assert parsed.media_type == fmt.media_type


def test_only_plain_text_parses_outside_the_sandbox() -> None:
    assert [f.media_type for f in FORMATS if not formats.sandboxed(f.media_type)] == [TEXT]
    assert formats.sandboxed("application/x-unknown")  # the child refuses it


def test_the_api_side_imports_no_parsing_library() -> None:
    """The API detects formats; the libraries that parse them stay in the worker's child."""
    code = (
        "import sys, rag.upload.accept, rag.upload.detect, rag.upload.formats; "
        "print(sorted(m for m in ('pypdf', 'docx', 'bs4', 'markdown_it') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
