"""What an upload really is: media type from magic bytes, checked against what it claims.

The declared type and the filename are hints, never the truth. A claim that the bytes
contradict (a `.pdf` that is not a PDF, binary bytes sent as text/plain) is refused as
spoofing, and so is anything outside the formats ragserve parses (`rag.upload.formats`).
"""

from __future__ import annotations

import io
import logging
import re
import struct
import unicodedata
import zipfile

from rag.errors import Invalid, UnsupportedMediaType
from rag.upload import formats

# The media types stay importable from here too, where callers have long found them.
from rag.upload.formats import (  # noqa: F401
    DOCX,
    HTML,
    MARKDOWN,
    PDF,
    SUPPORTED,
    TEXT,
    TEXT_TYPES,
    ZIP_MAGIC,
    Format,
)

log = logging.getLogger(__name__)

# Declared types that say nothing about the content.
_NO_CLAIM = {"", "application/octet-stream", "binary/octet-stream", "application/unknown"}

# Magic numbers of common formats we refuse, for a message that says what the file is.
_KNOWN_BINARY = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"RIFF", "a RIFF file (image, audio or video)"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x7fELF", "an ELF executable"),
    (b"MZ", "a Windows executable"),
    (b"\xcf\xfa\xed\xfe", "a Mach-O executable"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office (OLE2) file such as .doc"),
    (b"{\\rtf", "an RTF document"),
)
_MAX_FILENAME_CHARS = 200
_MAX_ZIP_ENTRIES = 10_000


def detect_media_type(data: bytes, filename: str | None, declared: str | None) -> str:
    """Return the media type of `data`, one of `SUPPORTED`, or raise.

    Raises `Invalid` for empty input and `UnsupportedMediaType` for unknown formats and for
    a filename extension or declared type that the bytes contradict.
    """
    if not data:
        raise Invalid("the file is empty")
    claims = _claims(filename, declared)
    found = _sniff_family(data)
    _check_claims(found, claims)
    if found is not None:
        return found.media_type
    for claim in claims:
        if claim in TEXT_TYPES:
            return claim
    return _guess_text_type(data)


def decode_text(data: bytes) -> str:
    """Decode text bytes: UTF-8 (BOM optional) or UTF-16 with a BOM. Raise on anything else."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise UnsupportedMediaType("the file claims UTF-16 text but does not decode") from exc
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UnsupportedMediaType(
                "the file is neither UTF-8 nor UTF-16 text nor a supported document format"
            ) from exc
    if "\x00" in text or _control_ratio(text) > 0.01:
        raise UnsupportedMediaType("the file contains binary data, not text")
    return text


def safe_filename(name: str | None) -> str:
    """A filename fit for display: no directories, no control characters, bounded length."""
    if not name:
        return "unnamed"
    base = re.split(r"[/\\]", name)[-1]
    base = "".join(ch for ch in base if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"))
    base = base.strip().strip(".").strip()
    if not base:
        return "unnamed"
    if len(base) > _MAX_FILENAME_CHARS:
        stem, dot, ext = base.rpartition(".")
        keep_ext = dot and 0 < len(ext) <= 16
        base = stem[: _MAX_FILENAME_CHARS - len(ext) - 1] + "." + ext if keep_ext else base
        base = base[:_MAX_FILENAME_CHARS]
    return base


def _claims(filename: str | None, declared: str | None) -> list[str]:
    """What the upload says it is, declared type first. Unknown hints make no claim."""
    claims: list[str] = []
    if declared is not None:
        media = declared.split(";", 1)[0].strip().lower()
        named = formats.by_declared(media)  # an alias names its format's media type
        media = named.media_type if named is not None else media
        if media not in _NO_CLAIM:
            # Other text/* types (csv, x-python) are fine as plain text.
            claims.append(TEXT if media.startswith("text/") and media not in SUPPORTED else media)
    if filename:
        ext = "." + safe_filename(filename).rpartition(".")[2].lower()
        by_extension = formats.by_extension(ext)
        if by_extension is not None:
            claims.append(by_extension.media_type)
    return claims


def _check_claims(found: Format | None, claims: list[str]) -> None:
    for claim in claims:
        if claim not in SUPPORTED:
            raise UnsupportedMediaType(f"unsupported media type {claim!r}")
        claimed_family = "text" if claim in TEXT_TYPES else claim
        if claimed_family != ("text" if found is None else found.media_type):
            raise UnsupportedMediaType(
                f"the file claims to be {claim} but its content is {_describe(found)}"
            )


def _describe(found: Format | None) -> str:
    return "text" if found is None else found.name


def _sniff_family(data: bytes) -> Format | None:
    """The binary format of `data`, or None for text; raises UnsupportedMediaType for
    anything else."""
    if data.startswith(ZIP_MAGIC):
        return _sniff_zip(data)
    for fmt in formats.FORMATS:
        if fmt.magic and data.startswith(fmt.magic):
            return fmt
    if data.startswith(b"{\\rtf"):  # RTF is text, but markup we do not parse
        raise UnsupportedMediaType("the file is an RTF document, which is not supported")
    try:
        decode_text(data)
    except UnsupportedMediaType:
        # Binary after all: say what it is when its magic number tells. (Only then: text that
        # merely starts like one, "MZ Wallace opened...", is text.)
        if not data.startswith((b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")):
            for magic, what in _KNOWN_BINARY:
                if data.startswith(magic):
                    raise UnsupportedMediaType(
                        f"the file is {what}, which is not supported"
                    ) from None
        raise
    return None


# The formats that are zip containers, as messages name them: "a .docx".
_ZIPPED = tuple(f for f in formats.FORMATS if f.zip_members)
_ZIP_KINDS = " or ".join(f"a {f.extensions[0]}" for f in _ZIPPED)


def _sniff_zip(data: bytes) -> Format:
    # Detection runs in the API process: look at the entry count before zipfile builds an
    # object per entry (a 50 MB upload could declare a million of them).
    if _zip_entry_count(data) > _MAX_ZIP_ENTRIES:
        raise UnsupportedMediaType(f"the zip archive has too many entries to be {_ZIP_KINDS}")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise UnsupportedMediaType("the file is a damaged zip archive") from None
    for fmt in _ZIPPED:
        if fmt.zip_members <= names:
            return fmt
    what = " or ".join(f.name for f in _ZIPPED)
    raise UnsupportedMediaType(f"a zip archive that is not {what} is not supported")


def _zip_entry_count(data: bytes) -> int:
    """Entries in the central directory, as zipfile would read them; huge when unreadable.

    The end-of-central-directory record's entry count is only a claim: zipfile reads every
    entry in the `size` bytes the record gives the directory, whatever the count says (a zip
    declaring 1 entry may hold 20,000). So the directory's real entries are counted here, by
    their header signatures in that range (at C speed; a signature inside a name only makes
    the count larger), before zipfile builds an object for each."""
    at = _end_record_at(data)
    if at == -1:
        return 0  # no record: zipfile will call the archive damaged
    if data[max(0, at - 20) : at].startswith(b"PK\x06\x07"):
        # A ZIP64 locator: zipfile would take the count and directory size from the ZIP64
        # record instead, which this count never saw. A .docx never needs ZIP64.
        raise UnsupportedMediaType(f"the zip archive uses ZIP64, which {_ZIP_KINDS} never needs")
    declared, size, offset = struct.unpack_from("<HII", data, at + 10)
    if declared == 0xFFFF or 0xFFFFFFFF in (size, offset):
        return 1 << 32  # ZIP64 markers, never a real .docx
    start = at - size  # where zipfile looks for the directory (data may precede the zip)
    if start < 0:
        return 0  # zipfile will call the archive damaged
    return max(int(declared), data.count(b"PK\x01\x02", start, at))


def _end_record_at(data: bytes) -> int:
    """Where zipfile finds the end-of-central-directory record, or -1: the last 22 bytes when
    they are a record without a comment, else the last signature in the final 64 KiB + 22
    (a signature inside the record's own fields must not move it)."""
    tail = len(data) - 22
    if tail >= 0 and data.startswith(b"PK\x05\x06", tail) and data.endswith(b"\x00\x00"):
        return tail
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 65_558))
    return at if at != -1 and at + 22 <= len(data) else -1


def _control_ratio(text: str) -> float:
    sample = text[:65536]
    controls = sum(1 for ch in sample if ch < " " and ch not in "\t\n\r\f\v\x1b")
    return controls / max(1, len(sample))


def _guess_text_type(data: bytes) -> str:
    sample = _decode_prefix(data)
    for fmt in formats.FORMATS:
        if fmt.is_text and (fmt.hint is None or fmt.hint(sample)):
            return fmt.media_type
    return TEXT


def _decode_prefix(data: bytes) -> str:
    # The prefix may end inside a multi-byte character; the whole file already decoded.
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data[:65536].decode("utf-16", errors="ignore")
    return data[:65536].decode("utf-8-sig", errors="ignore")
