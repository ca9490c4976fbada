"""What an answer can quote from a passage: its sentences and its table rows, each with the
words around it that say what it is about.

A document's facts stand in sentences ("It is held in the Uffizi Gallery in Florence.") and
in tables. Parsed tables come in three shapes: a row a line with cells between tabs (HTML and
DOCX), a markdown row with cells between pipes, or, from a PDF, a cell a line ("City", "Hotel
per night", "Meals per day", "Berlin", "€180", ...). All are read back into rows under their
header, so "the hotel limit in Munich" finds the cell where the Munich row meets the hotel
column. A passage that starts inside a table is given the table's header row from the text
before it in its document (`table_head`), since its chunk cut the header off.

Each unit carries its context: the heading above it (a short line without closing
punctuation), the document's title (its file name) and, for a passage that starts its
document, the first sentence (where a summary names its subject: "The Birth of Venus is a
painting by Botticelli." says what "It is held in the Uffizi" is about) and, for a list's item,
the sentence that introduces the list ("... fixed weekly windows, all on Sundays:").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rag.answer.segment import sentence_spans

Span = tuple[int, int]

# A heading: a short line without closing punctuation, not a table cell.
HEADING_MAX_WORDS = 8
# A PDF table's cell: a short line; a run of at least this many is read as a table.
CELL_MAX_WORDS = 5
GRID_MIN_LINES = 6
GRID_MAX_WIDTH = 6
GRID_MIN_ROWS = 3  # rows of a table whose header is not in the passage
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class Unit:
    """A sentence or a table row of a passage ([start, end) in its text)."""

    span: Span
    heading: str = ""  # the heading above it, "" when none
    # A table row: its cells' spans and the header's cell texts (same length), the first cell
    # naming the row.
    cells: tuple[Span, ...] = ()
    header: tuple[str, ...] = ()
    first: bool = False  # the first sentence of its passage
    subject: str = ""  # the passage's first sentence, when the passage starts its document
    # The sentence that introduces the list it is an item of ("Planned maintenance takes place
    # in fixed weekly windows, all on Sundays:" for "EU region (Frankfurt): 02:00 to 04:00").
    lead: str = ""


@dataclass(frozen=True)
class Head:
    """The header row of the table a passage starts inside, from the text before it."""

    row: str  # a markdown header comes with its rule on a second line
    cut: bool  # the passage's first line is the rest of a row cut at its start


@dataclass
class _Line:
    start: int
    end: int
    text: str


def units(text: str, starts_document: bool = False, head: Head | None = None) -> list[Unit]:
    """The sentences and table rows of `text`, in reading order. `head`: the header of the
    table `text` starts inside (`table_head`), when it does."""
    lines = _lines(text)
    out: list[Unit] = []
    heading = ""
    first_sentence = ""
    lead = ""
    i = 0
    prose: list[_Line] = []
    if head:
        continued = _continued_table(lines, head)
        if continued is not None:
            header, rows, i = continued
            out.extend(Unit((cells[0][0], cells[-1][1]), "", tuple(cells), header)
                       for cells in rows)  # fmt: skip

    def flush() -> None:
        nonlocal first_sentence, lead
        if not prose:
            return
        s, e = prose[0].start, prose[-1].end
        for a, b in sentence_spans(text[s:e]):
            span = (s + a, s + b)
            said = text[span[0] : span[1]]
            if _QUESTION.search(said):  # a question never answers (a FAQ's, cut off below it)
                continue
            lead = lead if _item(said) else ""
            if not first_sentence and not out:
                first_sentence = said
                out.append(Unit(span, heading, first=True))
            else:
                out.append(Unit(span, heading, subject=first_sentence if starts_document else "",
                                lead=lead))  # fmt: skip
            if said.rstrip().endswith(":"):
                lead = said
        prose.clear()

    while i < len(lines):
        line = lines[i]
        table = _tab_table(lines, i) or _pipe_table(lines, i) or _grid_table(lines, i)
        if table is not None:
            flush()
            header, rows, i = table
            for cells in rows:
                span = (cells[0][0], cells[-1][1])
                out.append(Unit(span, heading, tuple(cells), header,
                                subject=first_sentence if starts_document else ""))  # fmt: skip
            continue
        # A short line after "...:" is the list's item, not a heading.
        if (
            i + 1 < len(lines)
            and not (lead and not prose)
            and (_is_heading(line.text) or _asks(lines, i))
        ):
            flush()
            # A heading is the context of what follows it, never an answer itself ("4.2 Annual
            # leave", a FAQ's question).
            heading, lead = line.text.strip(), ""
            i += 1
            continue
        prose.append(line)
        if not line.text.strip():
            flush()
        i += 1
    flush()
    return out


_BULLET = re.compile(r"[-*\u2022]\s|\d{1,2}[.)]\s")


def _item(sentence: str) -> bool:
    """Whether a sentence reads as a list's item: it starts with a bullet or a number, or it
    is one line without closing punctuation."""
    body = sentence.strip()
    if not body:
        return False
    return bool(_BULLET.match(body)) or ("\n" not in body and body[-1] not in ".!?")


def _lines(text: str) -> list[_Line]:
    out = []
    at = 0
    for raw in text.splitlines(keepends=True):
        body = raw.rstrip("\r\n")
        s = at + (len(body) - len(body.lstrip()))
        e = at + len(body.rstrip())
        out.append(_Line(s, max(s, e), text[s : max(s, e)]))
        at += len(raw)
    return out


def _is_heading(line: str) -> bool:
    words = line.split()
    return (
        0 < len(words) <= HEADING_MAX_WORDS
        and line.strip()[-1] not in ".!?:;,"
        and "\t" not in line
        and not _DIGIT.fullmatch(line.strip())
    )


_QUESTION = re.compile(r"\?\s*$")
_MARKDOWN_HEADING = re.compile(r"#{1,6}\s")
QUESTION_MAX_WORDS = 16


def _asks(lines: list[_Line], i: int) -> bool:
    """Whether line i is a FAQ's question heading: a short line ending in "?", marked as a
    markdown heading or standing alone between blank lines (a parsed HTML or DOCX heading)."""
    text = lines[i].text.strip()
    if not _QUESTION.search(text) or not 0 < len(text.split()) <= QUESTION_MAX_WORDS:
        return False
    if _MARKDOWN_HEADING.match(text):
        return True
    alone_before = i == 0 or not lines[i - 1].text.strip()
    return alone_before and not lines[i + 1].text.strip()


def _cells(line: _Line) -> list[Span]:
    out = []
    at = line.start
    for part in line.text.split("\t"):
        stripped = part.strip()
        if stripped:
            s = at + part.index(stripped)
            out.append((s, s + len(stripped)))
        at += len(part) + 1
    return out


# How far back in its document a passage's table header is looked for (characters).
HEAD_LOOKBACK = 4000


def starts_in_table(text: str) -> bool:
    """Whether a passage's first lines may be rows of a table begun before it: the first two
    that are not blank (a row cut at its start, then the next one)."""
    lines = [line for line in text.split("\n", 8)[:8] if line.strip()][:2]
    return any("|" in line or "\t" in line for line in lines)


def table_head(before: str) -> Head | None:
    """The header row of the table whose rows end `before` (the document's text up to where
    a passage starts): None when it ends in no table, or the header is not within it."""
    lines = before.split("\n")
    # The passage starts inside a row, unless all it lacks is the row's opening pipe.
    cut = lines[-1].strip() not in ("", "|")
    lines = lines[:-1]  # the last line is the start of the passage's own first one, or ""
    j = len(lines) - 1
    if j < 0:
        return None
    if "|" in lines[j]:
        while j >= 1 and "|" in lines[j]:
            if _pipe_rule(lines[j]) and "|" in lines[j - 1]:
                return Head(lines[j - 1].strip() + "\n" + lines[j].strip(), cut)
            j -= 1
        return None
    top = -1
    while j >= 0 and ("\t" in lines[j] or not lines[j].strip()):
        if "\t" in lines[j]:
            top = j
        j -= 1
    if top >= 0 and j >= 0:  # the run's first line is its header, unless it starts `before`
        return Head(lines[top].strip(), cut)
    return None


def _continued_table(
    lines: list[_Line], head: Head
) -> tuple[tuple[str, ...], list[list[Span]], int] | None:
    """The rows at the start of `lines` of the table whose header is `head`: the header's
    cells, the rows' cell spans, and the line after them."""
    row = head.row.split("\n")[0]
    piped = "|" in row
    line = _Line(0, len(row), row)
    names = tuple(row[a:b] for a, b in (_pipe_cells(line) if piped else _cells(line)))
    # A row cut at its start is no row; a markdown table ends at a blank line (or a rule).
    rows, j = _rows(lines, 1 if head.cut else 0, len(names),
                    _pipe_data_row if piped else _tab_cells, across_blanks=not piped)  # fmt: skip
    return (names, rows, j) if rows else None


def _rows(
    lines: list[_Line], j: int, width: int, cells_of: Callable[[_Line], list[Span]],
    *, across_blanks: bool,
) -> tuple[list[list[Span]], int]:  # fmt: skip
    """Rows of `width` cells (`cells_of` a line) from line j on, blank lines between them
    allowed when `across_blanks`: the rows' cell spans and the line after them."""
    rows: list[list[Span]] = []
    while j < len(lines):
        line = lines[j]
        if across_blanks and not line.text.strip():
            j += 1
            continue
        cells = cells_of(line)
        if len(cells) != width:
            break
        rows.append(cells)
        j += 1
    return rows, j


def _tab_cells(line: _Line) -> list[Span]:
    return _cells(line) if "\t" in line.text else []


def _pipe_row(line: _Line) -> list[Span]:
    return _pipe_cells(line) if "|" in line.text else []


def _pipe_data_row(line: _Line) -> list[Span]:
    return [] if _pipe_rule(line.text) else _pipe_row(line)


def _tab_table(lines: list[_Line], i: int) -> tuple[tuple[str, ...], list[list[Span]], int] | None:
    """A table of tab-separated rows starting at line i (blank lines between rows allowed):
    the header's cells, the rows' cell spans, and the line after it."""
    if "\t" not in lines[i].text:
        return None
    head = _cells(lines[i])
    if len(head) < 2:
        return None
    rows, j = _rows(lines, i + 1, len(head), _tab_cells, across_blanks=True)
    if not rows:
        return None
    text_of = [lines[i].text[s - lines[i].start : e - lines[i].start] for s, e in head]
    return tuple(text_of), rows, j


def _pipe_cells(line: _Line) -> list[Span]:
    """The cells of a markdown table row ("| Business | €49 | €59 |"): the text between
    pipes, outer pipes optional."""
    text = line.text
    parts: list[Span] = []
    at = 0
    for part in text.split("|"):
        stripped = part.strip()
        if stripped:
            s = line.start + at + part.index(stripped)
            parts.append((s, s + len(stripped)))
        elif at > 0 and at + len(part) < len(text):  # an empty cell inside the row
            s = line.start + at
            parts.append((s, s))
        at += len(part) + 1
    return parts


def _pipe_rule(text: str) -> bool:
    """A markdown table's rule under its header: |---|:--:| ..."""
    body = text.strip()
    return "|" in body and "-" in body and not body.strip("|-: ")


def _pipe_table(lines: list[_Line], i: int) -> tuple[tuple[str, ...], list[list[Span]], int] | None:
    """A markdown table starting at line i: a header row, its rule, then rows of as many
    cells (the header's cells, the rows' cell spans, and the line after it)."""
    if "|" not in lines[i].text or i + 1 >= len(lines) or not _pipe_rule(lines[i + 1].text):
        return None
    head = _pipe_cells(lines[i])
    if len(head) < 2:
        return None
    rows, j = _rows(lines, i + 2, len(head), _pipe_row, across_blanks=False)
    if not rows:
        return None
    text_of = [lines[i].text[s - lines[i].start : e - lines[i].start] for s, e in head]
    return tuple(text_of), rows, j


def _grid_table(lines: list[_Line], i: int) -> tuple[tuple[str, ...], list[list[Span]], int] | None:
    """A PDF table: a run of short lines, a cell a line, read as rows of the width whose rows
    agree best. With a header (as many lines without digits as the width), then rows in
    which each column keeps to holding a number or not ("Berlin", "up to 3 days", "Tuesday";
    "3 to 4 years", "26 days"); or, where a chunk cut the header off, at least
    GRID_MIN_ROWS such rows from the run's start, each named by a first cell without digits.
    The reading that covers the most lines wins."""
    j = i
    while j < len(lines) and _short(lines[j].text):
        j += 1
    run = lines[i:j]
    if len(run) < GRID_MIN_LINES:
        return None
    best: tuple[int, int, int, list[list[Span]]] | None = None
    for width in range(2, GRID_MAX_WIDTH + 1):
        for header in (width, 0):
            if header and any(_DIGIT.search(line.text) for line in run[:header]):
                continue
            rows = _grid_rows(run[header:], width, named=not header)
            if len(rows) < (2 if header else GRID_MIN_ROWS):
                continue
            covered = header + len(rows) * width
            if best is None or covered > best[0]:
                best = (covered, width, header, rows)
    if best is None:
        return None
    covered, width, header, rows = best
    names = tuple(line.text for line in run[:header]) if header else ("",) * width
    return names, rows, i + covered


def _grid_rows(run: list[_Line], width: int, *, named: bool) -> list[list[Span]]:
    """Rows of `width` cells from the start of `run` while each column keeps to the first
    row's holding a number or not; a table of numbers: some cell past the first holds one.
    `named`: the first cell holds no digit."""
    pattern: tuple[bool, ...] | None = None
    rows = []
    for r in range(0, len(run) - width + 1, width):
        row = run[r : r + width]
        shape = tuple(bool(_DIGIT.search(c.text)) for c in row)
        if pattern is None:
            if not any(shape[1:]) or (named and shape[0]):
                return []
            pattern = shape
        elif shape != pattern:
            break
        rows.append([(c.start, c.end) for c in row])
    return rows


def _short(line: str) -> bool:
    words = line.split()
    return 0 < len(words) <= CELL_MAX_WORDS and line.strip()[-1] not in ".!?;,"
