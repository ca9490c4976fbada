"""Parsing each supported type, and every bad input ending in ParseError inside its limits."""

from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from pathlib import Path

import docx
import pytest
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from ingest.isolate import parse_isolated
from ingest.parse import ParseLimits, parse
from rag.config import IngestSettings
from rag.errors import ParseError, UnsupportedMediaType
from rag.upload.formats import DOCX, HTML, MARKDOWN, PDF, TEXT

LIMITS = ParseLimits(timeout_s=30, memory_mb=512)

# --- building documents ----------------------------------------------------------------------


def make_pdf(pages: list[str]) -> bytes:
    buf = io.BytesIO()
    pdf = canvas.Canvas(buf, pagesize=A4)
    for page in pages:
        y = 800
        for line in page.split("\n"):
            pdf.drawString(72, y, line)
            y -= 16
        pdf.showPage()
    pdf.save()
    return buf.getvalue()


def make_raw_pdf(content: bytes, *, compress: bool = True) -> bytes:
    """A one-page PDF whose content stream is `content` (FlateDecode unless told otherwise)."""
    stream = zlib.compress(content, 9) if compress else content
    filters = b"/Filter /FlateDecode " if compress else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< " + filters + b"/Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def make_docx() -> bytes:
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph("Revenue grew by twelve percent.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "Region"
    table.cell(0, 1).text = "Sales"
    table.cell(1, 0).text = "North"
    table.cell(1, 1).text = "42"
    document.add_heading("Outlook", level=2)
    document.add_paragraph("Next quarter looks steady.")
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


def replace_member(data: bytes, name: str, content: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info.filename, content if info.filename == name else source.read(info))
    return buf.getvalue()


def forge_declared_size(data: bytes, name: str, size: int) -> bytes:
    """Rewrite the central directory so `name` claims `size` uncompressed bytes."""
    raw = bytearray(data)
    at = raw.find(b"PK\x01\x02" + b"\x00" * 0, 0)
    while at != -1:
        name_len = struct.unpack_from("<H", raw, at + 28)[0]
        if raw[at + 46 : at + 46 + name_len] == name.encode():
            struct.pack_into("<I", raw, at + 24, size)
            return bytes(raw)
        at = raw.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} not in the zip")


BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n<!ENTITY lol "lol">\n'
    + "".join(
        f'<!ENTITY lol{i} "{"".join(f"&lol{i - 1};" if i > 1 else "&lol;" for _ in range(10))}">\n'
        for i in range(1, 10)
    )
    + "]>\n"
)


# --- good files ------------------------------------------------------------------------------


def test_plain_text_normalises_newlines() -> None:
    result = parse("caf\u00e9\r\nsecond line\rthird".encode(), TEXT, LIMITS)
    assert result.text == "caf\u00e9\nsecond line\nthird"
    assert result.media_type == TEXT


def test_utf16_text() -> None:
    assert parse("hello UTF-16".encode("utf-16"), TEXT, LIMITS).text == "hello UTF-16"


def test_markdown_keeps_source_and_finds_sections() -> None:
    source = "# Intro\n\nSome text.\n\n```\n# not a heading\n```\n\n## Details\n\nMore text.\n"
    result = parse(source.encode(), MARKDOWN, LIMITS)
    assert result.text == source
    assert [s.heading for s in result.sections] == ["Intro", "Details"]
    details = result.sections[1]
    assert result.text[details.start_char : details.end_char].startswith("## Details")
    assert result.sections[0].end_char == details.start_char


def test_html_visible_text_with_paragraph_breaks() -> None:
    page = (
        b"<!DOCTYPE html><html><head><title>Title</title><style>p{color:red}</style>"
        b"<script>alert('x')</script></head><body><h1>Heading</h1>"
        b"<p>First   <b>bold</b>\n paragraph &amp; more.</p><!-- a comment -->"
        b"<div hidden>secret</div><p>Second<br>line</p>"
        b"<ul><li>one</li><li>two</li></ul><table><tr><td>a</td><td>b</td></tr></table>"
        b"<pre>keep\nlines</pre></body></html>"
    )
    text = parse(page, HTML, LIMITS).text
    assert text == (
        "Title\n\nHeading\n\nFirst bold paragraph & more.\n\nSecond\nline\n\none\n\ntwo"
        "\n\na\tb\n\nkeep\nlines"
    )


def test_pdf_pages_and_sections() -> None:
    data = make_pdf(["Page one says hello.", "Page two says goodbye."])
    result = parse(data, PDF, LIMITS)
    assert result.page_count == 2
    assert "Page one says hello." in result.text
    assert [s.page for s in result.sections] == [1, 2]
    second = result.sections[1]
    assert result.text[second.start_char : second.end_char] == "Page two says goodbye."


def test_docx_paragraphs_tables_and_headings() -> None:
    result = parse(make_docx(), DOCX, LIMITS)
    assert result.text == (
        "Quarterly report\n\nRevenue grew by twelve percent.\n\nRegion\tSales\nNorth\t42"
        "\n\nOutlook\n\nNext quarter looks steady."
    )
    assert [s.heading for s in result.sections] == ["Quarterly report", "Outlook"]
    outlook = result.sections[1]
    assert result.text[outlook.start_char : outlook.end_char] == (
        "Outlook\n\nNext quarter looks steady."
    )


@pytest.mark.parametrize("kind", ["pdf", "docx", "html"])
def test_isolated_parse_matches_in_process(kind: str) -> None:
    data, media_type = {
        "pdf": (make_pdf(["Isolated page."]), PDF),
        "docx": (make_docx(), DOCX),
        "html": (b"<p>Isolated <i>html</i></p>", HTML),
    }[kind]
    limits = ParseLimits(timeout_s=30, memory_mb=256)
    assert parse_isolated(data, media_type, limits) == parse(data, media_type, limits)


def test_limits_from_settings() -> None:
    settings = IngestSettings(parse_timeout_s=5, parse_memory_mb=300, max_pages=7)
    limits = ParseLimits.from_settings(settings)
    assert (limits.timeout_s, limits.memory_mb, limits.max_pages) == (5, 300, 7)
    assert limits.max_text_chars == settings.max_text_chars


# --- bad files -------------------------------------------------------------------------------


def test_whitespace_only_document_has_no_text() -> None:
    with pytest.raises(ParseError, match="no text"):
        parse(b" \n\t\n ", TEXT, LIMITS)


def test_unknown_media_type() -> None:
    with pytest.raises(UnsupportedMediaType):
        parse(b"x", "image/png", LIMITS)


def test_text_over_the_character_limit() -> None:
    with pytest.raises(ParseError, match="longer than the limit"):
        parse(b"word " * 100, TEXT, ParseLimits(max_text_chars=50))


def test_binary_sent_as_text() -> None:
    with pytest.raises(ParseError, match="binary"):
        parse(b"abc\x00def", TEXT, LIMITS)


@pytest.mark.parametrize(
    "data",
    [b"%PDF-1.4\nthis is not really a pdf", b"%PDF-", make_pdf(["x"])[:200]],
)
def test_malformed_pdf(data: bytes) -> None:
    with pytest.raises(ParseError):
        parse_isolated(data, PDF, LIMITS)


def test_pdf_over_the_page_limit() -> None:
    data = make_pdf([f"page {i}" for i in range(12)])
    with pytest.raises(ParseError, match="12 pages, over the limit of 10"):
        parse_isolated(data, PDF, ParseLimits(max_pages=10))


def test_pdf_decompression_bomb() -> None:
    # ~100 KB on disk, 100 MB of content stream once inflated: over pypdf's per-stream cap,
    # and what gets through meets the child's memory limit and timeout.
    bomb = make_raw_pdf(b"BT /F1 12 Tf 72 700 Td (boom) Tj ET\n" + b" " * 100_000_000)
    assert len(bomb) < 200_000
    started = time.monotonic()
    with pytest.raises(ParseError):
        parse_isolated(bomb, PDF, ParseLimits(timeout_s=20, memory_mb=256))
    assert time.monotonic() - started < 20


def test_docx_not_a_zip() -> None:
    with pytest.raises(ParseError, match="not a valid zip"):
        parse(b"PK\x03\x04 and then nonsense", DOCX, LIMITS)


def test_docx_zip_bomb_by_ratio() -> None:
    # 64 MB of zeros deflate to ~64 KB: a ratio no real document part has.
    buf = io.BytesIO(make_docx())
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/media/zeros.bin", b"\x00" * 64 * 1024 * 1024)
    bomb = buf.getvalue()
    assert len(bomb) < 200_000
    with pytest.raises(ParseError, match="zip bomb"):
        parse_isolated(bomb, DOCX, LIMITS)


def test_docx_zip_bomb_by_declared_size() -> None:
    # A few KB that declare gigabytes: refused from the central directory, nothing extracted.
    bomb = forge_declared_size(make_docx(), "word/document.xml", 0xFFFF0000)
    assert len(bomb) < 100_000
    with pytest.raises(ParseError, match="zip bomb"):
        parse(bomb, DOCX, LIMITS)


def test_docx_xml_entity_bomb() -> None:
    original = zipfile.ZipFile(io.BytesIO(make_docx())).read("word/document.xml").decode()
    body = original.split("?>", 1)[1]  # drop the XML declaration, then add a DTD
    bomb_xml = (BILLION_LAUGHS + body.replace("Revenue grew", "&lol9; grew")).encode()
    bomb = replace_member(make_docx(), "word/document.xml", bomb_xml)
    with pytest.raises(ParseError, match="DTD or entities"):
        parse_isolated(bomb, DOCX, LIMITS)


def test_docx_external_entity_refused() -> None:
    original = zipfile.ZipFile(io.BytesIO(make_docx())).read("word/document.xml").decode()
    xxe = '<!DOCTYPE w [<!ENTITY x SYSTEM "file:///etc/passwd">]>' + original.split("?>", 1)[1]
    bomb = replace_member(make_docx(), "word/document.xml", xxe.encode())
    with pytest.raises(ParseError, match="DTD or entities"):
        parse(bomb, DOCX, LIMITS)


def test_docx_malformed_xml() -> None:
    broken = replace_member(make_docx(), "word/document.xml", b"<w:document><unclosed>")
    with pytest.raises(ParseError, match="not well-formed"):
        parse(broken, DOCX, LIMITS)


def test_html_entity_bomb_is_inert() -> None:
    page = (BILLION_LAUGHS + "<html><body><p>&lol9;</p></body></html>").encode()
    started = time.monotonic()
    try:
        result = parse_isolated(page, HTML, ParseLimits(timeout_s=20, memory_mb=256))
    except ParseError:
        pass  # failing is fine; expanding is not
    else:
        assert len(result.text) < 10_000
        assert "lollollol" not in result.text
        assert "ENTITY" not in result.text
        assert "]>" not in result.text
    assert time.monotonic() - started < 20


# --- the child process: time, memory, crashes ------------------------------------------------


def child_pids() -> set[int]:
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def test_parse_forever_times_out_and_leaves_no_child() -> None:
    before = child_pids()
    started = time.monotonic()
    with pytest.raises(ParseError, match="timed out after 1 s"):
        parse_isolated(
            b"x", TEXT, ParseLimits(timeout_s=1), parse_fn="tests.support.parsers:spin_forever"
        )
    assert time.monotonic() - started < 5
    assert child_pids() <= before  # killed and reaped: no zombie, no orphan


def test_sleeping_parser_times_out() -> None:
    with pytest.raises(ParseError, match="timed out after 0.5 s"):
        parse_isolated(
            b"x", TEXT, ParseLimits(timeout_s=0.5), parse_fn="tests.support.parsers:sleep_forever"
        )


def test_large_valid_input_under_a_tiny_timeout() -> None:
    data = make_pdf([f"line {i} " * 10 for i in range(300)])
    with pytest.raises(ParseError, match="timed out"):
        parse_isolated(data, PDF, ParseLimits(timeout_s=0.05))


def test_memory_hog_hits_the_memory_limit() -> None:
    with pytest.raises(ParseError, match="exceeded the memory limit of 256 MB"):
        parse_isolated(
            b"x", TEXT, ParseLimits(memory_mb=256), parse_fn="tests.support.parsers:allocate_4gb"
        )


def test_crashing_parser() -> None:
    with pytest.raises(ParseError, match="crashed"):
        parse_isolated(b"x", TEXT, LIMITS, parse_fn="tests.support.parsers:crash")


def test_parser_bug_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="KeyError"):
        parse_isolated(b"x", TEXT, LIMITS, parse_fn="tests.support.parsers:raise_bug")


def test_output_is_capped() -> None:
    with pytest.raises(ParseError, match="longer than the limit of 1,000"):
        parse_isolated(
            b"x",
            TEXT,
            ParseLimits(max_text_chars=1000),
            parse_fn="tests.support.parsers:too_much_text",
        )


def test_unicode_survives_the_round_trip() -> None:
    text = 'caf\u00e9 \u4e2d\u6587 \U0001f600 "quoted" \\ back\tslash'
    result = parse_isolated(text.encode(), TEXT, LIMITS, parse_fn="tests.support.parsers:echo")
    assert result.text == text
