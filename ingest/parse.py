"""Bytes of a known media type → plain text, inside limits.

`parse` does the work in this process; `parse_isolated` runs it in a fresh child interpreter
under a wall-clock timeout and an address-space limit, so a zip bomb, an entity bomb or a file
that parses forever fails its job with a reason instead of taking the worker down.

The child is a new interpreter (`python -c ...`), not a multiprocessing child: the worker has
torch and CUDA loaded, which rules out fork, and both "spawn" and "forkserver" re-import the
parent's `__main__` (the `rag` script and with it torch) before a single byte is parsed. Input
and output go through unlinked temporary files, so neither side can block on a full pipe, and
the result comes back as JSON, never pickle, so a compromised parser cannot reach the parent.
"""

from __future__ import annotations

import io
import logging
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.errors import ParseError, UnsupportedMediaType
from rag.upload import formats
from rag.upload.detect import decode_text

if TYPE_CHECKING:
    from docx.table import Table

    from rag.config import IngestSettings

log = logging.getLogger(__name__)

DEFAULT_PARSE_FN = "ingest.parse:parse"
_XML_READ_BYTES = 1 << 16


@dataclass(frozen=True)
class ParseLimits:
    timeout_s: float = 60.0
    memory_mb: int = 1024
    max_pages: int = 2000
    max_text_chars: int = 5_000_000
    # A .docx is a zip: refuse it before extracting when it declares too much.
    max_unzipped_bytes: int = 256 * 1024 * 1024
    max_zip_ratio: float = 200.0
    max_zip_entries: int = 10_000

    @classmethod
    def from_settings(cls, settings: IngestSettings) -> ParseLimits:
        return cls(
            timeout_s=settings.parse_timeout_s,
            memory_mb=settings.parse_memory_mb,
            max_pages=settings.max_pages,
            max_text_chars=settings.max_text_chars,
        )


@dataclass(frozen=True)
class Section:
    """A stretch of the extracted text: a PDF page, or the part under a heading."""

    start_char: int
    end_char: int
    page: int | None = None
    heading: str | None = None


@dataclass(frozen=True)
class ParsedText:
    text: str
    media_type: str
    sections: tuple[Section, ...] = ()
    page_count: int | None = None


ParseFn = Callable[[bytes, str, ParseLimits], ParsedText]


def parse(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    """Extract the text of a document in this process with its format's parser (one of the
    `parse_*` below, named in `rag.upload.formats`). Raises ParseError for bad files."""
    fmt = formats.by_media_type(media_type)
    if fmt is None:
        raise UnsupportedMediaType(f"no parser for media type {media_type!r}")
    parser: ParseFn = formats.load(fmt.parser)
    result = parser(data, media_type, limits)
    if not result.text.strip():
        raise ParseError("no text found in the document")
    return result


# --- text assembly ------------------------------------------------------------------------


class _TextBuilder:
    """Joins blocks with blank lines, counts characters, and records page/heading sections."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.length = 0
        self.sections: list[Section] = []
        self._heading: tuple[str, int] | None = None

    def add(self, block: str, *, page: int | None = None, heading: bool = False) -> None:
        block = _clean(block).strip()
        if not block:
            return
        if self.parts:
            self._append("\n\n")
        start = self.length
        if heading:
            self._close_heading()
            self._heading = (block[:200], start)
        self._append(block)
        if page is not None:
            self.sections.append(Section(start, self.length, page=page))

    def build(self, media_type: str, page_count: int | None = None) -> ParsedText:
        self._close_heading()
        return ParsedText("".join(self.parts), media_type, tuple(self.sections), page_count)

    def _append(self, piece: str) -> None:
        self.length += len(piece)
        if self.length > self.max_chars:
            raise ParseError(too_long(self.max_chars))
        self.parts.append(piece)

    def _close_heading(self) -> None:
        if self._heading is not None:
            title, start = self._heading
            self.sections.append(Section(start, self.length, heading=title))
            self._heading = None


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    # Lone surrogates (from broken PDFs) cannot be stored or sent as UTF-8.
    return text.encode("utf-8", "replace").decode("utf-8")


def too_long(max_chars: int) -> str:
    return f"the document's text is longer than the limit of {max_chars:,} characters"


def _decode(data: bytes, max_chars: int) -> str:
    try:
        text = _clean(decode_text(data))
    except UnsupportedMediaType as exc:
        raise ParseError(exc.message) from None
    if len(text) > max_chars:
        raise ParseError(too_long(max_chars))
    return text


# --- plain text and markdown: the source is the text ----------------------------------------


def parse_text(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    return ParsedText(_decode(data, limits.max_text_chars), media_type)


def parse_markdown(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    from markdown_it import MarkdownIt

    text = _decode(data, limits.max_text_chars)
    tokens = MarkdownIt("commonmark").parse(text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    headings: list[tuple[int, str]] = []
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.map and i + 1 < len(tokens):
            headings.append((line_starts[token.map[0]], tokens[i + 1].content.strip()[:200]))
    sections = tuple(
        Section(start, headings[j + 1][0] if j + 1 < len(headings) else len(text), heading=title)
        for j, (start, title) in enumerate(headings)
    )
    return ParsedText(text, media_type, sections)


# --- html ----------------------------------------------------------------------------------

_HTML_DROP = ["script", "style", "noscript", "template", "iframe", "object", "embed", "svg"]
_HTML_BLOCKS = [
    "p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "title",
    "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "tr",
    "blockquote", "pre", "figure", "figcaption", "hr", "address", "form", "fieldset", "caption",
]  # fmt: skip
_SPACES = re.compile(r"[ \t\f\v\n\r]+")
_DOCTYPE_SUBSET_OPEN = re.compile(
    r"\s*(?:<\?xml[^>]{0,200}\?>\s*)?<!DOCTYPE[^\[>]{0,200}\[", re.IGNORECASE
)
_DOCTYPE_SUBSET_CLOSE = re.compile(r"\][ \t\r\n]{0,100}>")


def parse_html(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    from bs4 import BeautifulSoup, NavigableString

    # html.parser never reads a DTD, so entity declarations (billion laughs) stay inert text.
    soup = BeautifulSoup(_drop_internal_subset(_decode(data, limits.max_text_chars)), "html.parser")
    for tag in soup.find_all(_HTML_DROP):
        tag.decompose()
    for tag in soup.find_all(hidden=True):
        if not tag.decomposed:
            tag.decompose()
    for string in list(soup.find_all(string=True)):
        if type(string) is NavigableString and string.find_parent("pre") is None:
            string.replace_with(_SPACES.sub(" ", string))
    for tag in soup.find_all(_HTML_BLOCKS):
        tag.insert_before("\n\n")
        tag.append("\n\n")
    for tag in soup.find_all("br"):
        tag.replace_with("\n")
    for tag in soup.find_all(["td", "th"]):
        tag.append("\t")
    builder = _TextBuilder(limits.max_text_chars)
    for block in re.split(r"\n[ \t]*\n", soup.get_text()):
        builder.add(re.sub(r"[ \t]*\n[ \t]*", "\n", block).strip(" \t"))
    return builder.build(media_type)


def _drop_internal_subset(text: str) -> str:
    """Remove a leading DOCTYPE's internal subset (entity declarations), which html.parser
    never expands but would otherwise leak into the text."""
    opened = _DOCTYPE_SUBSET_OPEN.match(text)
    if opened is None:
        return text
    closed = _DOCTYPE_SUBSET_CLOSE.search(text, opened.end())
    return text[closed.end() :] if closed else text


# --- pdf -----------------------------------------------------------------------------------


def parse_pdf(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    # pypdf caps each decoded stream (75 MB) and the page tree itself; the page limit, the
    # child's memory limit and its timeout bound everything else.
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseError("the PDF is encrypted with a password")
        page_count = len(reader.pages)
    except (ParseError, MemoryError):
        raise
    except Exception as exc:
        raise ParseError(f"the PDF could not be read ({type(exc).__name__})") from None
    if page_count > limits.max_pages:
        raise ParseError(
            f"the PDF has {page_count:,} pages, over the limit of {limits.max_pages:,}"
        )
    builder = _TextBuilder(limits.max_text_chars)
    for number, page in enumerate(reader.pages, start=1):
        try:
            page_text = page.extract_text() or ""
        except (ParseError, MemoryError):
            raise
        except Exception as exc:
            reason = f"page {number} of the PDF could not be read ({type(exc).__name__})"
            raise ParseError(reason) from None
        builder.add(page_text, page=number)
    return builder.build(media_type, page_count)


# --- docx ----------------------------------------------------------------------------------


def parse_docx(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    _check_docx_zip(data, limits)
    import docx
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        blocks = list(document.iter_inner_content())
    except MemoryError:
        raise
    except Exception as exc:
        raise ParseError(f"the .docx could not be read ({type(exc).__name__})") from None
    builder = _TextBuilder(limits.max_text_chars)
    for block in blocks:
        if isinstance(block, Table):
            builder.add(_table_text(block))
        else:
            style = block.style.name if block.style is not None else ""
            builder.add(block.text, heading=bool(style) and style.startswith(("Heading", "Title")))
    return builder.build(media_type)


def _table_text(table: Table) -> str:
    rows = []
    for row in table.rows:
        seen: list[object] = []
        cells = []
        for cell in row.cells:  # a merged cell repeats: keep it once
            if cell._tc not in seen:
                seen.append(cell._tc)
                cells.append(cell.text.strip())
        rows.append("\t".join(cells))
    return "\n".join(rows)


def _check_docx_zip(data: bytes, limits: ParseLimits) -> None:
    """Refuse zip bombs and XML with a DTD before python-docx extracts anything."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise ParseError("the .docx is not a valid zip archive") from None
    if len(infos) > limits.max_zip_entries:
        raise ParseError(f"the .docx has {len(infos):,} zip entries, over the limit")
    declared = sum(info.file_size for info in infos)
    if declared > limits.max_unzipped_bytes:
        raise ParseError(
            f"the .docx would unpack to {declared:,} bytes, over the limit of "
            f"{limits.max_unzipped_bytes:,} (zip bomb?)"
        )
    for info in infos:
        if info.file_size > (1 << 20) and info.file_size > limits.max_zip_ratio * max(
            1, info.compress_size
        ):
            raise ParseError(
                f"the .docx entry {info.filename!r} is compressed too densely (zip bomb?)"
            )
    budget = limits.max_unzipped_bytes
    for info in infos:
        if info.filename.endswith((".xml", ".rels")):
            budget -= _scan_xml(archive, info, budget)


def _scan_xml(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int) -> int:
    """Stream one XML part through expat: refuse any DTD or entity declaration, cap bytes read.

    DOCX parts never carry a DTD, so refusing one stops billion-laughs and external entities
    whatever the XML library behind python-docx would have done with them.
    """
    from xml.parsers import expat

    def refuse(*_args: object) -> None:
        raise ParseError(f"the .docx part {info.filename!r} declares a DTD or entities; refused")

    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse  # type: ignore[assignment]
    read = 0
    try:
        with archive.open(info) as member:
            while piece := member.read(_XML_READ_BYTES):
                read += len(piece)
                if read > budget:
                    raise ParseError("the .docx unpacks to more bytes than allowed (zip bomb?)")
                parser.Parse(piece, False)
            parser.Parse(b"", True)
    except expat.ExpatError as exc:
        reason = f"the .docx part {info.filename!r} is not well-formed XML ({exc.code})"
        raise ParseError(reason) from None
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError):
        raise ParseError(f"the .docx part {info.filename!r} could not be unpacked") from None
    return read
