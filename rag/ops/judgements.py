"""The judgement files of an evaluation, in the BEIR layout:

- queries.jsonl: one `{"_id": ..., "text": ...}` per line;
- qrels.tsv: `query-id <TAB> corpus-id <TAB> score` with a header line; score > 0 is relevant
  (graded scores are used as gains in nDCG);
- answers.jsonl (optional): `{"_id": ..., "answer": ...}` per line (`query-id`/`qid` and
  `text` are accepted too).

A line that is none of these is `Invalid`, with the file and line it is on.
"""

from __future__ import annotations

import json
from pathlib import Path

from rag.errors import Invalid

# query id -> corpus id -> graded relevance (> 0: relevant)
Qrels = dict[str, dict[str, int]]


def read_queries(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[str(row["_id"])] = str(row["text"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise Invalid(f"{path}:{n}: expected a JSON object with '_id' and 'text'") from None
    return out


def read_qrels(path: Path) -> Qrels:
    out: Qrels = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t") if "\t" in line else line.split()
        if not parts or not line.strip():
            continue
        if len(parts) < 3:
            raise Invalid(f"{path}:{n}: expected 'query-id corpus-id score'")
        try:
            score = int(float(parts[2]))
        except ValueError:
            if n == 1:
                continue  # the header line
            raise Invalid(f"{path}:{n}: score {parts[2]!r} is not a number") from None
        out.setdefault(parts[0], {})[parts[1]] = score
    return out


def read_answers(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise Invalid(f"{path}:{n}: not a JSON object") from None
        if not isinstance(row, dict):
            raise Invalid(f"{path}:{n}: not a JSON object")
        qid = row.get("_id", row.get("query-id", row.get("qid")))
        answer = row.get("answer", row.get("text"))
        if qid is None or answer is None:
            raise Invalid(f"{path}:{n}: expected '_id' and 'answer'")
        out[str(qid)] = str(answer)
    return out
