"""Misbehaving parse functions for tests of `ingest.isolate.parse_isolated` (run in the
child by name).

Each has the signature of `ingest.parse.parse`; point `parse_isolated(..., parse_fn=...)` at
"tests.support.parsers:<name>". Harmless to ship: nothing calls them unless asked to by name.
"""

from __future__ import annotations

import os
import signal
import time

from ingest.parse import ParsedText, ParseLimits


def sleep_forever(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    while True:
        time.sleep(1)


def spin_forever(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    n = 0
    while True:
        n += 1


def allocate_4gb(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    hog = bytearray(4 * 1024 * 1024 * 1024)
    return ParsedText(str(len(hog)), media_type)


def crash(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def too_much_text(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    return ParsedText("x" * (limits.max_text_chars + 1), media_type)


def raise_bug(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    raise KeyError("a parser bug")


def echo(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    return ParsedText(data.decode("utf-8"), media_type)


def report_environment(data: bytes, media_type: str, limits: ParseLimits) -> ParsedText:
    """The child's environment, as JSON text: what a parser could read."""
    import json

    return ParsedText(json.dumps(dict(os.environ)), media_type)
