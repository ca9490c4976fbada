"""Conversations as a user has them: `rag serve` with default settings, follow-ups asked over
HTTP in stored conversations, scored against the same questions written out in full.

    python bench/conversations.py            # every conversation of bench/qa/followups.jsonl
    python bench/conversations.py --quick    # every second one, and every second stand-alone

The set (bench/qa/followups.jsonl): two- and three-turn conversations over the wiki_vital
summaries and the company documents (those of bench/answers.py), each follow-up ambiguous
without its history ("Where is it set?", "And in London?"), with accepted answers, a gold
document and the question written out in full; and questions that stand alone, each asked
after an earlier turn (a rewrite must leave them as they are).

Measured:

- retrieved: the gold document among the k passages /search returns (k = 5, what /ask
  retrieves), for the follow-up with its history (the service's rewrite), as typed without
  history, the full question, and two candidates the service does not use, computed here from
  /search: the previous question and the follow-up searched together, and a reciprocal rank
  fusion of the follow-up alone with that;
- correct: /ask's answer holds an accepted string in its first two sentences (and no wrong
  one), for the follow-up in its stored conversation and for the full question alone;
- stand-alone: correct with the history (rewriting on) minus correct alone, in questions;
- the generator as a rewriter (--generator-rewrite): the bundled model asked to rewrite each
  stand-alone question, and how often it changed one that needed no rewrite;
- first token: a follow-up's first `token` event against its conversation's first question
  asked again alone (a first turn over passages used before), p50 of each;
- purge: every conversation deleted, then the bytes of their questions still in the files of
  the data directory after the purge interval (2 s here).

Ends with FIGURE lines: followup_retrieved_ratio, followup_correct_ratio,
standalone_correct_delta, second_turn_ttft_ratio, conversation_purge_leftovers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _sse import events  # noqa: E402
from answers import (  # noqa: E402
    ADMIN,
    free_port,
    holds,
    ingest_company,
    ingest_wiki,
    pct,
    start_server,
    wait_ready,
    wiki_docs,
    wiki_filename,
)

from tests.support.leftovers import leftover_bytes, scan  # noqa: E402

K = 5
PURGE_S = 2.0
REWRITE_PROMPT = (
    "Rewrite the last question so that it can be understood without the conversation. "
    "If it already can, repeat it unchanged. Write only the question."
)


@dataclass
class Asked:
    answer: str = ""
    source: str = ""
    searched: str = ""
    ttft_ms: float = float("nan")
    error: str = ""


@dataclass
class Scores:
    retrieved: dict[str, list[bool]] = field(default_factory=dict)
    correct: dict[str, list[bool]] = field(default_factory=dict)
    ttft: dict[str, list[float]] = field(default_factory=dict)

    def add(self, table: dict[str, list[Any]], key: str, value: Any) -> None:
        table.setdefault(key, []).append(value)


def ask(client: httpx.Client, h: dict[str, str], cid: str, question: str, **body: Any) -> Asked:
    out = Asked()
    t0 = time.perf_counter()
    try:
        with client.stream("POST", f"/v1/collections/{cid}/ask",
                           json={"question": question, "stream": True, **body},
                           headers=h) as r:  # fmt: skip
            if r.status_code != 200:
                r.read()
                out.error = f"HTTP {r.status_code}"
                return out
            for event, data in events(r):
                if event == "token" and out.ttft_ms != out.ttft_ms:
                    out.ttft_ms = (time.perf_counter() - t0) * 1000
                elif event == "final":
                    out.answer, out.source = data["answer"], data["answer_source"]
                    out.searched = data.get("searched_query") or ""
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
    return out


def search(client: httpx.Client, h: dict[str, str], cid: str, query: str, k: int = K,
           history: list[dict[str, str]] | None = None) -> list[str]:  # fmt: skip
    body: dict[str, Any] = {"query": query[:4000], "k": k}
    if history:
        body["history"] = history
    r = client.post(f"/v1/collections/{cid}/search", json=body, headers=h)
    r.raise_for_status()
    return [p["filename"] for p in r.json()["passages"]]


def fused(*rankings: list[str], k: int = K, c: int = 60) -> list[str]:
    """Reciprocal rank fusion of document rankings (a candidate, computed here)."""
    score: dict[str, float] = {}
    for ranking in rankings:
        for rank, name in enumerate(dict.fromkeys(ranking), start=1):
            score[name] = score.get(name, 0.0) + 1.0 / (c + rank)
    return sorted(score, key=lambda n: -score[n])[:k]


def generator_rewrite(client: httpx.Client, h: dict[str, str], history: list[dict[str, str]],
                      question: str) -> str:  # fmt: skip
    messages = [{"role": "system", "content": REWRITE_PROMPT}]
    for t in history:
        messages += [{"role": "user", "content": t["question"]},
                     {"role": "assistant", "content": t["answer"]}]  # fmt: skip
    messages.append({"role": "user", "content": question})
    body = {"model": "smollm2", "messages": messages, "max_tokens": 40, "temperature": 0}
    r = client.post("/v1/chat/completions", json=body, headers=h)
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"]).strip()


def same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()).rstrip("?.") == " ".join(b.lower().split()).rstrip("?.")


def rate(xs: list[bool]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def run_conversations(client: httpx.Client, h: dict[str, str], cids: dict[str, str],
                      convs: list[dict[str, Any]], gold: dict[str, str], s: Scores,
                      needles: list[bytes],
                      dump: list[dict[str, Any]] | None = None) -> list[str]:  # fmt: skip
    """Each conversation stored and asked turn by turn; their ids (to delete)."""
    made = []
    for c in convs:
        cid, want = cids[c["set"]], gold[c["gold"]]
        conv = client.post(f"/v1/collections/{cid}/conversations", headers=h).json()["id"]
        made.append(conv)
        history: list[dict[str, str]] = []
        for i, turn in enumerate(c["turns"]):
            q = turn["question"]
            if i == 0:
                ask(client, h, cid, q, conversation_id=conv)  # the first turn, cold
                again = ask(client, h, cid, q)  # a first turn over passages used before
                if not again.error and again.source != "refused":
                    s.add(s.ttft, "first turn (passages seen)", again.ttft_ms)
                history.append({"question": q, "answer": again.answer})
                continue
            prev = history[-1]["question"]
            typed = search(client, h, cid, q)
            rewritten = search(client, h, cid, q, history=history)
            full = search(client, h, cid, turn["full"])
            together = search(client, h, cid, f"{prev} {q}", k=20)
            alone = search(client, h, cid, q, k=20)
            for name, got in (("follow-up, rewritten (service)", rewritten),
                              ("follow-up as typed", typed), ("full question", full),
                              ("previous + follow-up", together[:K]),
                              ("fusion (RRF) of both", fused(alone, together))):  # fmt: skip
                s.add(s.retrieved, name, want in got)
            follow = ask(client, h, cid, q, conversation_id=conv)
            full_answer = ask(client, h, cid, turn["full"])
            s.add(s.correct, "follow-up in its conversation",
                  holds(follow.answer, turn["answers"], turn["wrong"]))  # fmt: skip
            s.add(s.correct, "full question alone",
                  holds(full_answer.answer, turn["answers"], turn["wrong"]))  # fmt: skip
            if not follow.error and follow.source != "refused":
                s.add(s.ttft, "follow-up (conversation)", follow.ttft_ms)
            if dump is not None:
                dump.append({
                    "set": c["set"], "history": [t["question"] for t in history],
                    "question": q, "searched": follow.searched, "full": turn["full"],
                    "answer": follow.answer, "source": follow.source,
                    "full_answer": full_answer.answer, "gold_retrieved": want in rewritten,
                    "correct": s.correct["follow-up in its conversation"][-1],
                    "full_correct": s.correct["full question alone"][-1],
                })  # fmt: skip
            # What the conversation alone holds: the full question was also asked outside it
            # (its answer is recorded apart, and kept), so a rewrite equal to it is not looked
            # for.
            needles += [t.encode() for t in (q, follow.searched)
                        if not same(t, turn["full"])]  # fmt: skip
            history.append({"question": q, "answer": follow.answer})
    return made


def run_standalone(client: httpx.Client, h: dict[str, str], cids: dict[str, str],
                   rows: list[dict[str, Any]], gold: dict[str, str], s: Scores,
                   generator: bool) -> dict[str, int]:  # fmt: skip
    changed = {"service": 0, "generator": 0, "n": 0}
    for r in rows:
        cid, want, q = cids[r["set"]], gold[r["gold"]], r["question"]
        history = r["history"]
        with_h = ask(client, h, cid, q, history=history)
        alone = ask(client, h, cid, q)
        s.add(s.correct, "stand-alone with history", holds(with_h.answer, r["answers"], r["wrong"]))
        s.add(s.correct, "stand-alone alone", holds(alone.answer, r["answers"], r["wrong"]))
        found = search(client, h, cid, q, history=history)
        s.add(s.retrieved, "stand-alone with history", want in found)
        s.add(s.retrieved, "stand-alone alone", want in search(client, h, cid, q))
        together = search(client, h, cid, f"{history[-1]['question']} {q}", k=20)
        s.add(s.retrieved, "stand-alone, previous + it", want in together[:K])
        changed["n"] += 1
        changed["service"] += not same(with_h.searched, q)
        if generator:
            changed["generator"] += not same(generator_rewrite(client, h, history, q), q)
    return changed


def purge_leftovers(client: httpx.Client, h: dict[str, str], made: list[tuple[str, str]],
                    data_dir: Path,
                    needles: list[bytes]) -> int:  # fmt: skip
    wanted = [n for n in dict.fromkeys(needles) if len(n) >= 20]
    files = [p for p in data_dir.rglob("*") if p.is_file() and p.name != "server.log"]
    before = leftover_bytes(scan(files, wanted))
    for cid, conv in made:
        client.delete(f"/v1/collections/{cid}/conversations/{conv}", headers=h)
    time.sleep(PURGE_S * 3)
    left = leftover_bytes(scan(files, wanted))
    print(f"purge: {len(wanted)} questions, {before} bytes of them before the deletes, "
          f"{left} after {PURGE_S * 3:.0f} s", flush=True)  # fmt: skip
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--every", type=int, help="every n-th conversation (default 1, quick 2)")
    ap.add_argument(
        "--generator-rewrite",
        action="store_true",
        help="also ask the bundled model to rewrite the stand-alone questions",
    )
    ap.add_argument("--keep", help="use (and keep) this data dir: a second run skips ingest")
    ap.add_argument("--dump", help="write every follow-up's answers as JSON lines here")
    args = ap.parse_args()
    every = args.every or (2 if args.quick else 1)
    rows = [json.loads(line) for line in (HERE / "qa" / "followups.jsonl").open()]
    convs = [r for r in rows if r["kind"] == "followup"][::every]
    alone = [r for r in rows if r["kind"] == "standalone"][::every]

    docs = wiki_docs()
    gold = {d["_id"]: wiki_filename(d) for d in docs}
    gold.update({r["gold"]: r["gold"] for r in rows if r["set"] == "company"})
    tmp = tempfile.TemporaryDirectory()
    data_dir = Path(args.keep or tmp.name)
    data_dir.mkdir(parents=True, exist_ok=True)
    fresh = not (data_dir / "bench-collections.json").exists()
    port = free_port()
    proc = start_server(data_dir, port, {"RAG_PURGE__INTERVAL_S": str(PURGE_S)})
    s = Scores()
    dump: list[dict[str, Any]] | None = [] if args.dump else None
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        wait_ready(client, proc, 600)
        if fresh:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            key = client.post("/v1/keys", json={"tenant": "bench"}, headers=admin).json()["key"]
            h = {"Authorization": f"Bearer {key}"}
            cids = {}
            for name in ("company", "wiki"):
                cids[name] = client.post("/v1/collections", json={"name": name},
                                         headers=h).json()["id"]  # fmt: skip
                if name == "wiki":
                    ingest_wiki(client, h, cids[name], docs)
                else:
                    ingest_company(client, h, cids[name], data_dir / "company-docs")
            (data_dir / "bench-collections.json").write_text(json.dumps({"key": key, **cids}))
        saved = json.loads((data_dir / "bench-collections.json").read_text())
        h = {"Authorization": f"Bearer {saved['key']}"}
        cids = {"wiki": saved["wiki"], "company": saved["company"]}
        t = time.perf_counter()
        needles: list[bytes] = []
        made = run_conversations(client, h, cids, convs, gold, s, needles, dump)
        print(f"{len(convs)} conversations in {time.perf_counter() - t:.0f} s", flush=True)
        changed = run_standalone(client, h, cids, alone, gold, s, args.generator_rewrite)
        pairs = [(cids[c["set"]], m) for c, m in zip(convs, made, strict=True)]
        leftovers = purge_leftovers(client, h, pairs, data_dir, needles)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)

    if args.dump and dump is not None:
        Path(args.dump).write_text("".join(json.dumps(d) + "\n" for d in dump))
    n_follow = len(s.correct.get("follow-up in its conversation", []))
    print(f"\n{len(convs)} conversations ({n_follow} follow-ups), {len(alone)} stand-alone "
          f"questions (every {every}), default settings over HTTP\n")  # fmt: skip
    print("| retrieval (gold among the top 5) | rate | n |\n|---|---|---|")
    for name, xs in s.retrieved.items():
        print(f"| {name} | {rate(xs):.3f} | {len(xs)} |")
    print("\n| answers | correct | n |\n|---|---|---|")
    for name, xs in s.correct.items():
        print(f"| {name} | {rate(xs):.3f} | {len(xs)} |")
    print("\n| first token event | p50 ms | p90 ms | n |\n|---|---|---|---|")
    for name, ts in s.ttft.items():
        print(f"| {name} | {pct(ts, 50):.0f} | {pct(ts, 90):.0f} | {len(ts)} |")
    print(f"\nstand-alone questions rewritten: service {changed['service']} of {changed['n']}"
          + (f", generator {changed['generator']} of {changed['n']}"
             if args.generator_rewrite else ""))  # fmt: skip
    r = s.retrieved
    c = s.correct
    ratio = rate(r["follow-up, rewritten (service)"]) / max(1e-9, rate(r["full question"]))
    correct_ratio = rate(c["follow-up in its conversation"]) / max(
        1e-9, rate(c["full question alone"])
    )
    delta = sum(c["stand-alone with history"]) - sum(c["stand-alone alone"])
    ttft = pct(s.ttft.get("follow-up (conversation)", []), 50) / pct(
        s.ttft.get("first turn (passages seen)", []), 50
    )
    print()
    print(f"FIGURE followup_retrieved_ratio {ratio:.3f}")
    print(f"FIGURE followup_correct_ratio {correct_ratio:.3f}")
    print(f"FIGURE standalone_correct_delta {delta:+d}")
    print(f"FIGURE second_turn_ttft_ratio {ttft:.2f}")
    print(f"FIGURE conversation_purge_leftovers {leftovers}")


if __name__ == "__main__":
    main()
