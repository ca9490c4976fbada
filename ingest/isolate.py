"""Parsing in a child interpreter under time and memory limits.

A bad file (a zip bomb, an XML entity bomb, a PDF that decompresses forever) fails its job with
a reason; it never takes the worker down. The child is a fresh interpreter, not a fork of the
worker (which holds torch and its threads); the document goes in and the result comes out
through temporary files as JSON, never pickle. It gets a bare environment (`child_env`):
a parser reading hostile bytes has no business with the database URL, the admin key or the
remote engine's key.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from ingest.parse import DEFAULT_PARSE_FN, ParsedText, ParseFn, ParseLimits, Section, too_long
from rag.errors import ParseError, RagError
from rag.upload import formats

log = logging.getLogger(__name__)

_EXIT_MEMORY = 3

# What the child keeps of the worker's environment: finding programs and libraries, a home and
# a temporary directory, the locale. Nothing named RAG_*, no credentials of any kind.
_CHILD_ENV = (
    "PATH",
    "HOME",
    "TMPDIR",
    "TEMP",
    "TMP",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "SYSTEMROOT",
)

_CHILD_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from ingest.isolate import _child_main; _child_main()"
)


def parse_isolated(
    data: bytes, media_type: str, limits: ParseLimits, *, parse_fn: str = DEFAULT_PARSE_FN
) -> ParsedText:
    """`parse` in a child interpreter under the time and memory limits.

    `parse_fn` ("module:function") is what the child runs; tests point it at
    `tests.support.parsers`.
    """
    header = {"media_type": media_type, "limits": asdict(limits), "parse_fn": parse_fn}
    root = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout:
        stdin.write(json.dumps(header).encode() + b"\n")
        stdin.write(data)
        stdin.seek(0)
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_BOOT, root],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=child_env(os.environ),
        )
        try:
            returncode = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            log.info("parse of %s timed out after %g s", media_type, limits.timeout_s)
            raise ParseError(f"parsing timed out after {limits.timeout_s:g} s") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return _read_result(returncode, stdout, media_type, limits)


def child_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The parser child's environment: the basics of `parent`, and nothing else."""
    env = {name: parent[name] for name in _CHILD_ENV if name in parent}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _read_result(
    returncode: int, out: IO[bytes], media_type: str, limits: ParseLimits
) -> ParsedText:
    if returncode == _EXIT_MEMORY:
        raise ParseError(f"parsing exceeded the memory limit of {limits.memory_mb} MB")
    if returncode == -9 or returncode == -24:  # SIGKILL (OOM killer), SIGXCPU (CPU limit)
        raise ParseError("the parser was killed (out of memory or CPU time)")
    if returncode != 0:
        log.warning("parser child for %s exited with %d", media_type, returncode)
        raise ParseError(f"the parser crashed (exit status {returncode})")
    size = out.seek(0, os.SEEK_END)
    if size > 6 * limits.max_text_chars + (1 << 20):
        raise ParseError("the parser produced more output than allowed")
    out.seek(0)
    try:
        payload = json.loads(out.read())
    except ValueError:
        raise ParseError("the parser returned no result") from None
    if not payload.get("ok"):
        raise ParseError(str(payload.get("error", "parsing failed")))
    text = str(payload["text"])
    if len(text) > limits.max_text_chars:
        raise ParseError(too_long(limits.max_text_chars))
    sections = tuple(Section(**s) for s in payload["sections"])
    return ParsedText(text, str(payload["media_type"]), sections, payload["page_count"])


def _child_main() -> None:
    """Entry point of the parser child: header line + document on stdin, JSON on stdout."""
    stdin = sys.stdin.buffer
    header = json.loads(stdin.readline())
    data = stdin.read()
    try:
        payload = _run_child(header, data)
        out = json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace")
    except MemoryError:
        os._exit(_EXIT_MEMORY)
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    os._exit(0)


def _run_child(header: dict[str, Any], data: bytes) -> dict[str, object]:
    limits = ParseLimits(**header["limits"])
    try:
        parse_fn: ParseFn = formats.load(header["parse_fn"])
        _preload(header["media_type"])
        _limit_resources(limits)
        result = parse_fn(data, header["media_type"], limits)
        if len(result.text) > limits.max_text_chars:
            raise ParseError(too_long(limits.max_text_chars))
        return {"ok": True, **asdict(result)}
    except RagError as exc:
        return {"ok": False, "error": exc.message}
    except RecursionError:
        return {"ok": False, "error": "the document is nested too deeply"}
    except MemoryError:
        raise
    except Exception as exc:  # a parser bug or a file no parser expected: fail the file
        return {"ok": False, "error": f"the parser failed ({type(exc).__name__})"}


def _preload(media_type: str) -> None:
    """Import the format's parser and its libraries before the memory limit, so the limit is
    for the parse."""
    fmt = formats.by_media_type(media_type)
    if fmt is None:
        return  # `parse` refuses it
    formats.load(fmt.parser)
    for name in fmt.preload:
        importlib.import_module(name)


def _limit_resources(limits: ParseLimits) -> None:
    import resource

    cap = _address_space_bytes() + limits.memory_mb * 1024 * 1024
    _set_limit(resource.RLIMIT_AS, cap)
    # CPU time backs up the parent's wall clock: SIGXCPU, then SIGKILL a second later.
    _set_limit(resource.RLIMIT_CPU, math.ceil(limits.timeout_s) + 1, slack=1)
    _set_limit(resource.RLIMIT_CORE, 0)


def _set_limit(kind: int, value: int, *, slack: int = 0) -> None:
    import resource

    _soft, hard = resource.getrlimit(kind)
    new_hard = value + slack
    if hard != resource.RLIM_INFINITY:
        value, new_hard = min(value, hard), min(new_hard, hard)
    resource.setrlimit(kind, (value, new_hard))


def _address_space_bytes() -> int:
    """The child's address space now: interpreter, libraries and the input already read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 512 * 1024 * 1024
    return pages * os.sysconf("SC_PAGE_SIZE")
