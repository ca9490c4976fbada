"""The file formats ragserve ingests: one `Format` entry each, read by detection (the API side,
`rag.upload.detect`) and by parsing (the worker side, `ingest.parse` and `ingest.isolate`).

Adding a format is adding an entry to `FORMATS` (and its parser function): docs/formats.md.

Nothing here imports a parsing library. The API imports this module, and a PDF or .docx
library has no business in its process, so a parser is named as "module:function" and only
imported by the worker, or by the sandboxed child that runs it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TEXT = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


@dataclass(frozen=True)
class Format:
    media_type: str
    name: str  # what its content is called in a message: "a PDF"
    extensions: tuple[str, ...]  # lower case, with the dot
    parser: str  # "module:function" with the signature of `ingest.parse.parse`
    # False only where parsing cannot hurt the process it runs in (the API's own, when the
    # worker is in-process); everything else parses in a child under time and memory limits.
    sandboxed: bool = True
    # Leading bytes that identify a binary format. Empty: a text format (it decodes as text,
    # and its claim or `hint` tells it from the other text formats).
    magic: tuple[bytes, ...] = ()
    # A zip container (magic ZIP_MAGIC) is this format when it holds all of these.
    zip_members: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()  # other declared media types that mean this one
    preload: tuple[str, ...] = ()  # libraries the child imports before its memory limit
    # For a text format without a claim: does this sample (the first 64 KiB) look like it?
    # Text formats are tried in `FORMATS` order; one without a hint takes any text.
    hint: Callable[[str], bool] | None = None

    @property
    def is_text(self) -> bool:
        return not self.magic


_HTML_HINT = re.compile(r"<!doctype\s+html|<html[\s>]|<head[\s>]|<body[\s>]", re.IGNORECASE)
# Linear on any input: a link's text stops at the next `[` and its target at the next `(`,
# so the scans from different starting brackets never overlap (`[^\]\n]+` rescanned a run of
# `[` from each of them, quadratic and holding the GIL), and both are bounded.
_MD_HINT = re.compile(
    r"^(#{1,6} \S|```|~~~|[-*+] \S|\d+\. \S|> \S)"
    r"|\[[^\[\]\n]{1,500}\]\([^()\n]{1,2000}\)|\*\*\S",
    re.MULTILINE,
)


def _looks_like_html(sample: str) -> bool:
    return _HTML_HINT.search(sample[:4096]) is not None


def _looks_like_markdown(sample: str) -> bool:
    return len(_MD_HINT.findall(sample)) >= 2


# Order matters among the text formats only, for text without a claim: HTML before Markdown
# (a page may hold lines that look like Markdown), plain text last, as it takes any text.
FORMATS: tuple[Format, ...] = (
    Format(
        HTML,
        "HTML",
        (".html", ".htm", ".xhtml"),
        "ingest.parse:parse_html",
        aliases=("application/xhtml+xml",),
        preload=("bs4",),
        hint=_looks_like_html,
    ),
    # Sandboxed: markdown-it is slow on hostile input (runs of `[`), and in-process parsing
    # would hold the API's own process when the worker runs there.
    Format(
        MARKDOWN,
        "Markdown",
        (".md", ".markdown"),
        "ingest.parse:parse_markdown",
        aliases=("text/x-markdown",),
        preload=("markdown_it",),
        hint=_looks_like_markdown,
    ),
    # Plain text needs no sandbox: decoding is bounded by the upload size limit.
    Format(TEXT, "text", (".txt", ".text"), "ingest.parse:parse_text", sandboxed=False),
    Format(
        PDF,
        "a PDF",
        (".pdf",),
        "ingest.parse:parse_pdf",
        magic=(b"%PDF-",),
        aliases=("application/x-pdf",),
        preload=("pypdf",),
    ),
    Format(
        DOCX,
        "a .docx document",
        (".docx",),
        "ingest.parse:parse_docx",
        magic=ZIP_MAGIC,
        zip_members=frozenset({"word/document.xml", "[Content_Types].xml"}),
        preload=("docx",),
    ),
)

SUPPORTED = tuple(f.media_type for f in FORMATS)
TEXT_TYPES = tuple(f.media_type for f in FORMATS if f.is_text)

_BY_MEDIA_TYPE = {f.media_type: f for f in FORMATS}
_BY_ALIAS = {alias: f for f in FORMATS for alias in f.aliases}
_BY_EXTENSION = {ext: f for f in FORMATS for ext in f.extensions}


def by_media_type(media_type: str) -> Format | None:
    """The format of a media type as detection returns it, or None."""
    return _BY_MEDIA_TYPE.get(media_type)


def by_declared(media_type: str) -> Format | None:
    """The format a declared media type names, directly or by an alias, or None."""
    return _BY_MEDIA_TYPE.get(media_type) or _BY_ALIAS.get(media_type)


def by_extension(extension: str) -> Format | None:
    """The format of a lower-case extension with its dot (".pdf"), or None."""
    return _BY_EXTENSION.get(extension)


def sandboxed(media_type: str) -> bool:
    """Whether the worker parses this media type in the sandboxed child: every format not
    marked otherwise, and any unknown type (the child's `parse` refuses it)."""
    fmt = by_media_type(media_type)
    return fmt is None or fmt.sandboxed


def load(dotted: str) -> Callable[..., Any]:
    """The function a "module:function" name gives, importing its module."""
    module_name, _, name = dotted.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module_name), name)
    return fn
