"""Write bench/qa/wiki_collection.txt: the ids of a ~3,000-passage wiki_vital collection in
which near-neighbours compete (novels with novels, painters with painters, ...).

Every passage of each family below is included (a family = passages whose description
matches the family's pattern, optionally limited to some topics); then the collection is
filled up to TARGET with other passages from the families' topics, chosen in a fixed
pseudo-random order (sha1 of the id), so the output is deterministic.

    python bench/qa/make_wiki_collection.py          # writes bench/qa/wiki_collection.txt

Standard library only. The gold passages of bench/qa/wiki_factual.jsonl all lie in the
families (bench/qa/check_sets.py checks that every gold is in the collection). Changing
FAMILIES or TARGET changes the collection: rerun check_sets.py afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

PASSAGES = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki_vital" / "passages.jsonl"
OUT = Path(__file__).resolve().parent / "wiki_collection.txt"
TARGET = 3000

# name -> (regex on description, topics it is limited to or None)
FAMILIES: dict[str, tuple[str, set[str] | None]] = {
    "novels": (r"\bnovel\b", None),
    "films": (r"\bfilms?\b", {"Arts"}),
    "paintings": (r"\bpaintings?\b", {"Arts"}),
    "painters": (r"\bpainter\b", None),
    "composers": (r"\bcomposer\b", None),
    "wars": (r"\b(war|battle|siege|revolution|rebellion|uprising)\b", {"History"}),
    "elements": (r"\bchemical element\b", None),
    "physicists": (r"\bphysicist\b", None),
    "chemists": (r"\bchemist\b", {"People", "Uncategorized"}),
    "mathematicians": (r"\bmathematician\b", None),
    "poets": (r"\bpoet\b", None),
    "cities": (r"\b(city|capital)\b", {"Geography"}),
    "rivers": (r"\briver\b", {"Geography"}),
    "countries": (r"\bcountry\b", {"Geography", "Uncategorized"}),
    "diseases": (r"\bdiseases?\b", {"Biology and health sciences"}),
    "rulers": (r"\b(emperor|king of|queen of)\b", {"People"}),
}


def load() -> list[dict]:
    with PASSAGES.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def family_members(passages: list[dict]) -> dict[str, list[str]]:
    out = {}
    for name, (pattern, topics) in FAMILIES.items():
        rx = re.compile(pattern, re.I)
        out[name] = [
            p["_id"]
            for p in passages
            if rx.search(p.get("description") or "") and (topics is None or p["topic"] in topics)
        ]
    return out


def _order(pid: str) -> str:
    return hashlib.sha1(pid.encode()).hexdigest()


def build(passages: list[dict], target: int = TARGET) -> list[str]:
    by_id = {p["_id"]: p for p in passages}
    fams = family_members(passages)
    chosen: set[str] = set()
    for ids in fams.values():
        chosen.update(ids)
    topics = {by_id[i]["topic"] for i in chosen} - {"Uncategorized"}
    fill = sorted(
        (p["_id"] for p in passages if p["topic"] in topics and p["_id"] not in chosen), key=_order
    )
    chosen.update(fill[: max(0, target - len(chosen))])
    return sorted(chosen, key=lambda i: int(i.split("-")[1]))


def main() -> int:
    passages = load()
    fams = family_members(passages)
    ids = build(passages)
    OUT.write_text("".join(i + "\n" for i in ids), encoding="utf-8")
    for name, members in fams.items():
        print(f"{name:15s} {len(members):4d}")
    print(f"families total {len(set().union(*fams.values()))}, collection {len(ids)} -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
