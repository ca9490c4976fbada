"""Media type detection by magic bytes, spoofing refusal, and display-safe filenames."""

from __future__ import annotations

import io
import random
import struct
import zipfile

import pytest

from rag.errors import Invalid, UnsupportedMediaType
from rag.upload.detect import detect_media_type, safe_filename
from rag.upload.formats import DOCX, HTML, MARKDOWN, PDF, TEXT

PDF_BYTES = b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n"


def _zip(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name in names:
            archive.writestr(name, "<x/>")
    return buf.getvalue()


DOCX_BYTES = _zip(["[Content_Types].xml", "_rels/.rels", "word/document.xml"])


@pytest.mark.parametrize(
    ("data", "filename", "declared", "expected"),
    [
        (PDF_BYTES, None, None, PDF),
        (PDF_BYTES, "report.PDF", "application/pdf", PDF),
        (PDF_BYTES, "report.pdf", "application/octet-stream", PDF),
        (DOCX_BYTES, None, None, DOCX),
        (DOCX_BYTES, "memo.docx", DOCX, DOCX),
        (b"just some words\n", None, None, TEXT),
        (b"just some words\n", "notes.txt", "text/plain; charset=utf-8", TEXT),
        (b"a,b\n1,2\n", "table.csv", "text/csv", TEXT),
        (b"# Title\n\nSome *text* and a [link](http://x).\n", None, None, MARKDOWN),
        (b"plain words", "readme.md", None, MARKDOWN),
        (b"plain words", None, "text/x-markdown", MARKDOWN),
        (b"<!DOCTYPE html><html><body><p>hi</p></body></html>", None, None, HTML),
        (b"<p>fragment</p>", "page.htm", None, HTML),
        (b"<p>fragment</p>", None, "text/html; charset=utf-8", HTML),
        # The extension decides between text types: an HTML-looking .txt stays plain text.
        (b"<html><body>x</body></html>", "snippet.txt", None, TEXT),
        ("caf\u00e9 \u2013 na\u00efve".encode(), None, None, TEXT),
        ("\ufeffwith a BOM".encode(), None, None, TEXT),
        ("UTF-16 text".encode("utf-16"), "u16.txt", None, TEXT),
        ("# UTF-16 md\n\n- item\n".encode("utf-16"), None, None, MARKDOWN),
    ],
)
def test_detects_supported_types(
    data: bytes, filename: str | None, declared: str | None, expected: str
) -> None:
    assert detect_media_type(data, filename, declared) == expected


def test_empty_file_is_invalid() -> None:
    with pytest.raises(Invalid, match="empty"):
        detect_media_type(b"", "empty.txt", "text/plain")


@pytest.mark.parametrize(
    ("data", "filename", "declared", "message"),
    [
        (b"not a pdf at all", "invoice.pdf", None, "claims to be application/pdf"),
        (b"not a pdf at all", None, "application/pdf", "claims to be application/pdf"),
        (PDF_BYTES, "letter.docx", None, "claims to be application/vnd"),
        (DOCX_BYTES, "paper.pdf", None, "content is a .docx"),
        (_zip(["a.txt", "b.txt"]), "archive.docx", None, "zip archive that is not a .docx"),
        (_zip(["a.txt"]), None, None, "zip archive that is not a .docx"),
        (b"PK\x03\x04garbage", "x.docx", None, "damaged zip"),
        (PDF_BYTES, "doc.txt", "text/plain", "content is a PDF"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "photo.txt", "text/plain", "PNG image"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, None, None, "PNG image"),
        (b"\xff\xd8\xff\xe0" + b"\x00" * 64, "cat.jpg", "image/jpeg", "JPEG image"),
        (b"\x7fELF\x02\x01\x01" + b"\x00" * 64, "tool", None, "ELF executable"),
        (b"MZ\x90\x00" + b"\x00" * 64, "setup.exe", None, "Windows executable"),
        (b"\x1f\x8b\x08\x00" + b"\x00" * 16, "data.gz", None, "gzip"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 64, "old.doc", None, "OLE2"),
        (b"text with a \x00 NUL byte", "n.txt", "text/plain", "binary"),
        (b"\x01\x02\x03\x04 mostly controls \x05\x06\x07\x08", None, None, "binary"),
        (b"\xc3\x28 invalid utf-8", "bad.txt", "text/plain", "neither UTF-8"),
        (b"plain text", None, "image/png", "unsupported media type 'image/png'"),
        (b"plain text", None, "application/zip", "unsupported media type"),
    ],
)
def test_refuses_unknown_and_spoofed(
    data: bytes, filename: str | None, declared: str | None, message: str
) -> None:
    with pytest.raises(UnsupportedMediaType, match=message):
        detect_media_type(data, filename, declared)


def test_refuses_zip_declaring_too_many_entries() -> None:
    data = bytearray(DOCX_BYTES)
    eocd = data.rfind(b"PK\x05\x06")
    data[eocd + 10 : eocd + 12] = (60_000).to_bytes(2, "little")
    with pytest.raises(UnsupportedMediaType, match="too many entries"):
        detect_media_type(bytes(data), "big.docx", None)


def test_refuses_random_binary() -> None:
    rng = random.Random(7)
    for _ in range(20):
        junk = rng.randbytes(4096)
        with pytest.raises(UnsupportedMediaType):
            detect_media_type(junk, "blob.txt", "text/plain")
        with pytest.raises(UnsupportedMediaType):
            detect_media_type(junk, None, None)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, "unnamed"),
        ("", "unnamed"),
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("/abs/path/file.txt", "file.txt"),
        ("C:\\Users\\me\\doc.docx", "doc.docx"),
        ("..\\..\\boot.ini", "boot.ini"),
        ("evil\x00name.txt", "evilname.txt"),
        ("tab\tand\nnewline\r.md", "tabandnewline.md"),
        ("right\u202eto-left.txt", "rightto-left.txt"),
        ("..", "unnamed"),
        ("../", "unnamed"),
        ("  spaced.txt  ", "spaced.txt"),
        ("caf\u00e9.txt", "caf\u00e9.txt"),
    ],
)
def test_safe_filename(name: str | None, expected: str) -> None:
    assert safe_filename(name) == expected


def test_safe_filename_limits_length_and_keeps_extension() -> None:
    name = safe_filename("a" * 5000 + ".pdf")
    assert len(name) <= 200
    assert name.endswith(".pdf")
    assert "/" not in safe_filename("x/" * 3000)


def _lying_zip(entries: int) -> bytes:
    """A .docx-looking zip whose end record declares 1 entry but holds `entries` + 3."""
    names = ["[Content_Types].xml", "_rels/.rels", "word/document.xml"]
    data = bytearray(_zip(names + [f"word/media/{i}.xml" for i in range(entries)]))
    at = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, at + 8, 1, 1)  # entries on this disk, entries in all
    return bytes(data)


def test_a_zip_that_understates_its_entries_is_refused_before_zipfile_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rag.upload import detect

    data = _lying_zip(20_000)
    assert len(zipfile.ZipFile(io.BytesIO(data)).namelist()) == 20_003  # zipfile reads all
    opened: list[object] = []
    monkeypatch.setattr(detect.zipfile, "ZipFile", lambda *a, **k: opened.append(a))
    with pytest.raises(UnsupportedMediaType, match="too many entries"):
        detect_media_type(data, "big.docx", DOCX)
    assert opened == []


def test_a_small_zip_with_a_wrong_count_is_still_read() -> None:
    assert detect_media_type(_lying_zip(10), "memo.docx", DOCX) == DOCX


def _zip64_lying(entries: int) -> bytes:
    """A .docx-looking zip whose classic end record declares 1 entry and a tiny directory,
    with a ZIP64 end record and locator (which zipfile prefers) giving the real directory."""
    names = ["[Content_Types].xml", "_rels/.rels", "word/document.xml"]
    data = bytearray(_zip(names + [f"word/media/{i}.xml" for i in range(entries)]))
    at = data.rfind(b"PK\x05\x06")
    total, size, offset = struct.unpack_from("<HII", data, at + 10)
    real = len(names) + entries
    record64 = struct.pack(
        "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, real, real, size, offset
    )
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)
    end = bytearray(data[at:])
    struct.pack_into("<HHI", end, 8, 1, 1, len(record64) + len(locator))  # 1 entry, tiny size
    return bytes(data[:at]) + record64 + locator + bytes(end)


def test_a_zip64_archive_is_refused_before_zipfile_reads_its_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rag.upload import detect

    data = _zip64_lying(20_000)
    assert len(zipfile.ZipFile(io.BytesIO(data)).namelist()) == 20_003  # zipfile reads all
    opened: list[object] = []
    monkeypatch.setattr(detect.zipfile, "ZipFile", lambda *a, **k: opened.append(a))
    with pytest.raises(UnsupportedMediaType, match="ZIP64"):
        detect_media_type(data, "big.docx", DOCX)
    assert opened == []


def test_an_end_record_found_where_zipfile_finds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """zipfile takes the last 22 bytes as the end record when they look like one; a later
    signature inside that record's own fields must not hide it from the count."""
    from rag.upload import detect

    data = bytearray(_lying_zip(20_000))
    at = data.rfind(b"PK\x05\x06")
    # zipfile finds the directory just before the end record whatever its offset field says
    # (data may precede a zip), so the field may read as a signature: rfind then stops there.
    data[at + 16 : at + 20] = b"PK\x05\x06"
    padded = bytes(data)
    assert padded.rfind(b"PK\x05\x06") == len(padded) - 6
    assert len(zipfile.ZipFile(io.BytesIO(padded)).namelist()) == 20_003
    opened: list[object] = []
    monkeypatch.setattr(detect.zipfile, "ZipFile", lambda *a, **k: opened.append(a))
    with pytest.raises(UnsupportedMediaType, match="too many entries"):
        detect._sniff_family(padded)
    assert opened == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("run", ["[", "[a", "[a](", "[a](b"])
def test_markdown_hint_is_linear_on_bracket_runs(run: str) -> None:
    """The markdown hint backtracked quadratically on runs of `[` (64 KiB: 15 s holding the
    GIL). The whole sniffed prefix of such runs must take milliseconds."""
    import time

    data = (run * (65_536 // len(run) + 1)).encode()[:65_536]
    started = time.perf_counter()
    assert detect_media_type(data, None, None) in (TEXT, MARKDOWN)
    assert time.perf_counter() - started < 1.0
