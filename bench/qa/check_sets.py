"""Validate the QA sets in bench/qa against their documents.

    python bench/qa/check_sets.py            # every known set; exit 1 on any problem
    python bench/qa/check_sets.py wiki       # one set by name

A set is a JSONL file of questions, one object a line:
    {"id", "question", "answers": [str], "gold": doc id | null, "wrong": [str],
     "kind", "paraphrased": bool, "answerable": bool, "half": "a" | "b"}
and a dict of its documents {id: text} (the collection the questions are asked of).

`check(questions, docs)` returns a list of problems (empty: the set is valid); it knows
nothing of where the documents come from, so another set (bench/qa/company_*) is added by
writing a loader and an entry in SETS. Standard library only.

wiki2 and company2 are second sets written apart from the first (other summaries, other
made-up organisations, by other writers), without wrong strings or wiki unanswerables: a
check that a rule chosen on the first sets generalises.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

KINDS = {"person", "year", "place", "number", "name", "other"}
HALVES = {"a", "b"}
MAX_ANSWER_WORDS = 6


def phrase_re(s: str) -> re.Pattern:
    """s as a whole word/phrase, case-insensitive: \\b at either end where s starts or ends
    with a word character (so '18' does not match inside '1818', 'C++' still matches);
    whitespace inside s matches any whitespace."""
    s = s.strip()
    left = r"\b" if re.match(r"\w", s) else r"(?<!\w)"
    right = r"\b" if re.search(r"\w$", s) else r"(?!\w)"
    # any run of whitespace matches any other (the texts hold no-break spaces: "22\xa0minutes")
    body = r"\s+".join(re.escape(part) for part in s.split())
    return re.compile(left + body + right, re.IGNORECASE)


def occurs(s: str, text: str) -> bool:
    return bool(phrase_re(s).search(text))


def load_jsonl(path: Path) -> list[dict]:
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not JSON ({e})") from None
    return out


def check(
    questions: list[dict],
    docs: dict[str, str],
    *,
    wrong_elsewhere: bool = True,
    balance_slack: int = 2,
) -> list[str]:
    """Problems with `questions` asked of the collection `docs` ({id: text}).

    wrong_elsewhere: every wrong string must occur in some collection document other than
    the gold one (it is a trap taken from a neighbour). balance_slack: how far the two halves
    may differ in each count (per kind, paraphrased, answerable)."""
    problems: list[str] = []
    seen: set[str] = set()
    for n, q in enumerate(questions, 1):
        qid = q.get("id")
        where = f"{qid or f'line {n}'}"

        def p(msg: str, where: str = where) -> None:
            problems.append(f"{where}: {msg}")

        if not isinstance(qid, str) or not qid:
            p("missing id")
        elif qid in seen:
            p("duplicate id")
        seen.add(qid)
        bad_fields = [
            field
            for field, typ in (
                ("question", str),
                ("answers", list),
                ("wrong", list),
                ("kind", str),
                ("paraphrased", bool),
                ("answerable", bool),
                ("half", str),
            )
            if not isinstance(q.get(field), typ)
        ]
        if bad_fields:
            p(f"fields missing or of the wrong type: {', '.join(bad_fields)}")
            continue
        if not q["question"].strip().endswith("?"):
            p("question does not end with '?'")
        if q["kind"] not in KINDS:
            p(f"kind {q['kind']!r} not one of {sorted(KINDS)}")
        if q["half"] not in HALVES:
            p(f"half {q['half']!r} not a or b")
        answers, wrong, gold = q["answers"], q["wrong"], q.get("gold")
        if any(not isinstance(a, str) or not a.strip() for a in answers + wrong):
            p("an answer or wrong string is empty or not a string")
            continue
        if len(set(a.lower() for a in answers)) != len(answers):
            p("duplicate accepted answers")
        if not q["answerable"]:
            if answers or wrong or gold is not None:
                p("unanswerable question must have answers [], wrong [], gold null")
            if q["paraphrased"]:
                p("unanswerable question marked paraphrased")
            continue
        if not answers:
            p("answerable question without answers")
        if gold not in docs:
            p(f"gold {gold!r} not in the collection")
            continue
        text = docs[gold]
        for a in answers:
            if len(a.split()) > MAX_ANSWER_WORDS:
                p(f"answer {a!r} longer than {MAX_ANSWER_WORDS} words")
            if not occurs(a, text):
                p(f"answer {a!r} does not occur in gold {gold}")
        for w in wrong:
            if occurs(w, text):
                p(f"wrong {w!r} occurs in gold {gold}")
            if any(w.lower() in a.lower() for a in answers):
                p(f"wrong {w!r} is a substring of an accepted answer")
            if wrong_elsewhere and not any(occurs(w, t) for i, t in docs.items() if i != gold):
                p(f"wrong {w!r} occurs in no other collection document")
    problems += balance(questions, balance_slack)
    return problems


def balance(questions: list[dict], slack: int) -> list[str]:
    problems = []
    for label, key in (
        ("answerable", lambda q: q.get("answerable")),
        ("paraphrased", lambda q: q.get("paraphrased")),
        ("kind", lambda q: q.get("kind")),
    ):
        a = Counter(key(q) for q in questions if q.get("half") == "a")
        b = Counter(key(q) for q in questions if q.get("half") == "b")
        for v in sorted(set(a) | set(b), key=str):
            if abs(a[v] - b[v]) > slack:
                problems.append(f"halves unbalanced: {label}={v}: a {a[v]}, b {b[v]}")
    return problems


def summary(questions: list[dict]) -> str:
    lines = [f"{len(questions)} questions"]
    for half in sorted(HALVES):
        qs = [q for q in questions if q.get("half") == half]
        ans = [q for q in qs if q.get("answerable")]
        kinds = Counter(q.get("kind") for q in ans)
        lines.append(
            f"  half {half}: {len(qs)} ({len(ans)} answerable, {len(qs) - len(ans)} unanswerable,"
            f" {sum(bool(q.get('paraphrased')) for q in ans)} paraphrased) kinds "
            + " ".join(f"{k}={kinds[k]}" for k in sorted(kinds))
        )
    ans = [q for q in questions if q.get("answerable")]
    lines.append(
        f"  total: {len(ans)} answerable ({sum(bool(q.get('paraphrased')) for q in ans)}"
        f" paraphrased, {sum(bool(q.get('wrong')) for q in ans)} with wrong),"
        f" {len(questions) - len(ans)} unanswerable"
    )
    return "\n".join(lines)


# ---- sets ------------------------------------------------------------------------------


def wiki_docs(listing: str = "wiki_collection.txt") -> dict[str, str]:
    lines = (HERE / listing).read_text().splitlines()
    ids = [line.strip() for line in lines if line.strip()]
    wanted = set(ids)
    docs = {}
    with (SHARED / "wiki_vital" / "passages.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["_id"] in wanted:
                docs[d["_id"]] = d["text"]
    missing = wanted - set(docs)
    if missing:
        raise SystemExit(
            f"{listing} names {len(missing)} ids not in the corpus, e.g. {sorted(missing)[:3]}"
        )
    if len(ids) != len(wanted):
        raise SystemExit(f"{listing} has duplicate ids")
    return docs


def company2_docs() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((HERE / "company2").iterdir())}


# name -> (questions file, loader of {id: text}); add the company set here.
SETS: dict[str, tuple[Path, Callable[[], dict[str, str]]]] = {
    "wiki": (HERE / "wiki_factual.jsonl", wiki_docs),
    "wiki2": (HERE / "wiki2_factual.jsonl", lambda: wiki_docs("wiki2_collection.txt")),
    "company2": (HERE / "company2_factual.jsonl", company2_docs),
}


def main(argv: Iterable[str]) -> int:
    names = list(argv) or list(SETS)
    failed = False
    for name in names:
        if name not in SETS:
            print(f"unknown set {name!r}; known: {', '.join(SETS)}")
            return 2
        path, loader = SETS[name]
        questions = load_jsonl(path)
        docs = loader()
        problems = check(questions, docs)
        print(f"== {name}: {path.name} against {len(docs)} documents")
        print(summary(questions))
        for pr in problems:
            print("  PROBLEM", pr)
        print(f"  {'OK' if not problems else f'{len(problems)} problems'}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
