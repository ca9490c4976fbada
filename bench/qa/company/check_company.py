"""Check bench/qa/company_factual.jsonl against the company documents as ragserve extracts them.

    .venv/bin/python bench/qa/company/check_company.py        (from the repository root)

Builds the documents with make_docs.py into a temporary folder, extracts their text with the
project's own parser (ingest.parse.parse) and checks that

- every accepted answer occurs in the gold document's extracted text as a whole word or phrase
  (case-insensitive, exact: a phrase broken across a PDF line counts as missing),
- no wrong string is an accepted answer or occurs inside one, and wrong strings of answerable
  questions occur in at least one document (else they trap nothing: reported as a warning),
- ids are unique, fields and values are well formed, unanswerable questions have no answers,
  gold or wrong strings,

then prints counts per half, kind, gold, paraphrased and answerable. Exits 1 on any violation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
QUESTIONS = HERE.parent / "company_factual.jsonl"
KINDS = {"number", "date", "person", "place", "name", "period", "other"}
FIELDS = ["id", "question", "answers", "gold", "wrong", "kind", "paraphrased", "answerable", "half"]

sys.path.insert(0, str(ROOT))


def media_types() -> dict[str, str]:
    from rag.upload.detect import DOCX, HTML, MARKDOWN, PDF

    return {"handbook.pdf": PDF, "guide.docx": DOCX, "page.html": HTML, "faq.md": MARKDOWN}


def extract(folder: Path) -> dict[str, str]:
    from ingest.parse import ParseLimits, parse

    return {
        name: parse((folder / name).read_bytes(), media_type, ParseLimits()).text
        for name, media_type in media_types().items()
    }


def phrase(answer: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(answer)}(?!\w)", re.IGNORECASE)


def main() -> int:
    errors: list[str] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(HERE / "make_docs.py"), tmp], check=True)
        texts = extract(Path(tmp))
        sizes = {name: (Path(tmp) / name).stat().st_size for name in texts}
    for name, text in texts.items():
        print(
            f"{name:14s} {len(text.split()):5d} words  {len(text):6d} chars  {sizes[name]:6d} bytes"
        )

    rows = [
        json.loads(line)
        for line in QUESTIONS.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    ids = Counter(row.get("id") for row in rows)
    for qid, n in ids.items():
        if n > 1:
            errors.append(f"id {qid} used {n} times")
    for row in rows:
        qid = row.get("id")
        if list(row) != FIELDS:
            errors.append(f"{qid}: fields {list(row)} != {FIELDS}")
            continue
        if row["kind"] not in KINDS:
            errors.append(f"{qid}: kind {row['kind']!r}")
        if row["half"] not in ("a", "b"):
            errors.append(f"{qid}: half {row['half']!r}")
        if not isinstance(row["paraphrased"], bool) or not isinstance(row["answerable"], bool):
            errors.append(f"{qid}: paraphrased/answerable must be booleans")
        if not row["question"].strip():
            errors.append(f"{qid}: empty question")
        answers, wrong = row["answers"], row["wrong"]
        if not row["answerable"]:
            if answers or wrong or row["gold"] is not None or row["paraphrased"]:
                errors.append(f"{qid}: unanswerable with answers, wrong, gold or paraphrased set")
            continue
        if row["gold"] not in texts:
            errors.append(f"{qid}: gold {row['gold']!r} is not a document")
            continue
        if not answers:
            errors.append(f"{qid}: answerable without answers")
        text = texts[row["gold"]]
        for answer in answers:
            if len(answer.split()) > 4:
                errors.append(f"{qid}: answer {answer!r} longer than 4 words")
            if not phrase(answer).search(text):
                errors.append(f"{qid}: answer {answer!r} not in the text of {row['gold']}")
        lowered = [a.lower() for a in answers]
        for w in wrong:
            if any(w.lower() in a for a in lowered):
                errors.append(f"{qid}: wrong {w!r} is (inside) an accepted answer {answers}")
            if not any(phrase(w).search(t) for t in texts.values()):
                warnings.append(f"{qid}: wrong {w!r} occurs in no document")

    answerable = [r for r in rows if r.get("answerable")]
    print(
        f"\n{len(rows)} questions: {len(answerable)} answerable, "
        f"{len(rows) - len(answerable)} unanswerable, "
        f"{sum(1 for r in answerable if r.get('paraphrased'))} paraphrased, "
        f"{sum(1 for r in answerable if r.get('wrong'))} with wrong strings"
    )
    for half in ("a", "b"):
        part = [r for r in rows if r.get("half") == half]
        ans = [r for r in part if r.get("answerable")]
        print(
            f"half {half}: {len(part)} questions, {len(ans)} answerable "
            f"({sum(1 for r in ans if r.get('paraphrased'))} paraphrased), "
            f"{len(part) - len(ans)} unanswerable"
        )
        print("   gold:", dict(sorted(Counter(str(r.get("gold")) for r in part).items())))
        print("   kind:", dict(sorted(Counter(r.get("kind") for r in part).items())))
    for w in warnings:
        print("warning:", w)
    for e in errors:
        print("ERROR:", e)
    print("OK" if not errors else f"{len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
