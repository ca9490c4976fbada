"""Factual answers as a user sees them: `rag serve` with default settings, asked over HTTP one
question at a time, scored against what each question's document states.

    python bench/answers.py            # every question of both sets, both halves
    python bench/answers.py --quick    # a third of each set's questions (~10 min, 2 cores)

The question sets (bench/qa, checked by bench/qa/check_sets.py and check_company.py):

- wiki: factual questions over ~3,000 wiki_vital summaries (../shared/data) in which
  near-neighbours compete (novels with novels, painters with painters), with the answers of
  the near-neighbours' facts as "wrong" strings, and unanswerable questions about the same
  entities or about entities not in the collection;
- company: questions over four documents of a made-up company (a PDF handbook, a DOCX guide
  with tables, an HTML page, a markdown FAQ; bench/qa/company/make_docs.py) full of
  near-duplicate facts (limits by city and plan, periods by tenure, close versions).

Two more sets, asked only when named (`--sets wiki2,company2`), were written apart from
those (other summaries, other made-up organisations, by other writers): wiki2, 711 questions
over 360 other summaries among 2,360; company2, 216 answerable and 40 unanswerable questions
over eight markdown documents of two organisations. They have no wrong strings and wiki2 no
unanswerable questions; they tell whether a rule chosen on the first sets generalises.

Each set is split into halves a and b: settings were chosen on a; both are reported.

An answer is correct when an accepted string stands, as a whole word, in its first two
sentences and no near-duplicate's answer does; cited when the gold document is among its
citations (citation precision: the share of its citations that are the gold document). An
unanswerable question is refused when answer_source is "refused". Loops: finish reason
`repetition`; echoes: sentences repeating the system instruction.

The default and the extractive mode run on the same server, one after the other. First token:
the first `token` event after the request left; "seen" when the passage the answer was given
had been given to an earlier question of the run, "unseen" otherwise. `generated`: when the
generated sentence arrived (evidence "one": after the quote), for answers that have one.

Ends with FIGURE lines: factual_correct, factual_cited, citation_precision, refusal_rate,
false_refusal_rate, loops, echoes, correct_vs_extractive (the default minus extractive, the
lowest over the sets), ttft_p50_unseen_ms, ttft_p50_seen_ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _data import shared  # noqa: E402
from _sse import events  # noqa: E402
from sentencex import segment  # noqa: E402

ADMIN = "bench-answers-admin-key-0123456789"
# "all": every passage retrieved in one prompt, the answer as the generator writes it (what
# the service did by default before evidence first); run it with --configs default,all.
CONFIGS = {"default": {}, "extractive": {"mode": "extractive"}, "all": {"evidence": "all"}}


@dataclass(frozen=True)
class Question:
    set: str
    qid: str
    question: str
    answers: tuple[str, ...]
    wrong: tuple[str, ...]
    gold: str | None  # the gold document's file name
    paraphrased: bool
    half: str

    @property
    def answerable(self) -> bool:
        return bool(self.answers)


@dataclass
class Outcome:
    q: Question
    config: str
    answer: str = ""
    source: str = ""
    finish: str = ""
    cited_files: list[str] = field(default_factory=list)
    given_chunks: list[int] = field(default_factory=list)
    ttft_ms: float = float("nan")
    generated_ms: float | None = None
    seen: bool = False
    echoed: bool = False
    error: str = ""


# ---------------------------------------------------------------- the sets


def load_questions(path: Path, set_name: str, gold_file: dict[str, str] | None) -> list[Question]:
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        gold = d.get("gold")
        if gold is not None and gold_file is not None:
            gold = gold_file[gold]
        out.append(Question(set_name, d["id"], d["question"], tuple(d["answers"]),
                            tuple(d["wrong"]), gold, bool(d.get("paraphrased")),
                            d["half"]))  # fmt: skip
    return out


def wiki_docs(listing: str = "wiki_collection.txt") -> list[dict[str, str]]:
    ids = set((HERE / "qa" / listing).read_text().split())
    docs = []
    with shared("wiki_vital", "passages.jsonl").open() as f:
        for line in f:
            d = json.loads(line)
            if d["_id"] in ids:
                docs.append(d)
    return docs


def wiki_filename(d: dict[str, str]) -> str:
    return re.sub(r"[^\w\s().,'-]", "_", d["title"])[:180] + ".txt"


SETS = ("wiki", "company", "wiki2", "company2")
LISTINGS = {"wiki": "wiki_collection.txt", "wiki2": "wiki2_collection.txt"}


def questions_of(
    sets: Sequence[str], every: int = 1, wiki: list[dict[str, str]] | None = None
) -> list[Question]:
    """The questions of the sets named, in the order of SETS, thinned to every `every`-th;
    `wiki`: wiki's documents, when the caller has read them already."""
    out: list[Question] = []
    for s in SETS:
        if s not in sets:
            continue
        names = None
        if s in LISTINGS:
            docs = wiki if s == "wiki" and wiki is not None else wiki_docs(LISTINGS[s])
            names = {d["_id"]: wiki_filename(d) for d in docs}
        out += thin(load_questions(HERE / "qa" / f"{s}_factual.jsonl", s, names), every)
    return out


def thin(questions: list[Question], every: int) -> list[Question]:
    """Every `every`-th question of each half, answerable and not, in file order."""
    out = []
    for half in ("a", "b"):
        for answerable in (True, False):
            qs = [q for q in questions if q.half == half and q.answerable == answerable]
            out += qs[::every]
    return out


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    data_dir: Path, port: int, settings: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`rag serve` with default settings, but those given (RAG_* variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_DATA_DIR=str(data_dir), RAG_AUTH__ADMIN_KEY=ADMIN, RAG_API__PORT=str(port),
               HF_HUB_OFFLINE="1", **(settings or {}))  # fmt: skip
    log = (data_dir / "server.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "rag.cli", "serve"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def wait_ready(client: httpx.Client, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit("the server exited; see server.log in its data dir")
        try:
            r = client.get("/readyz")
            if r.status_code == 200 and r.json()["checks"]["generator"]["loaded"]:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become ready")


def wait_indexed(client: httpx.Client, h: dict[str, str], cid: str, n: int) -> None:
    while True:
        counts = client.get(f"/v1/collections/{cid}", headers=h).json()["documents"]
        if counts.get("indexed", 0) + counts.get("failed", 0) >= n:
            if counts.get("failed", 0):
                print(f"  {counts['failed']} documents failed", flush=True)
            return
        time.sleep(1)


def ingest_wiki(client: httpx.Client, h: dict[str, str], cid: str, docs: list[dict]) -> None:
    for i in range(0, len(docs), 500):
        batch = [{"text": d["text"], "filename": wiki_filename(d)} for d in docs[i : i + 500]]
        client.post(f"/v1/collections/{cid}/documents", json={"documents": batch},
                    headers=h).raise_for_status()  # fmt: skip
    wait_indexed(client, h, cid, len(docs))


def ingest_company(client: httpx.Client, h: dict[str, str], cid: str, folder: Path) -> None:
    subprocess.run([sys.executable, str(HERE / "qa" / "company" / "make_docs.py"), str(folder)],
                   check=True)  # fmt: skip
    ingest_files(client, h, cid, folder)


def ingest_files(client: httpx.Client, h: dict[str, str], cid: str, folder: Path) -> None:
    files = sorted(folder.iterdir())
    handles = [("files", (p.name, p.read_bytes())) for p in files]
    client.post(f"/v1/collections/{cid}/documents", files=handles,
                headers=h).raise_for_status()  # fmt: skip
    wait_indexed(client, h, cid, len(files))


@contextlib.contextmanager
def served(
    data_dir: Path, sets: Sequence[str], docs: list[dict[str, str]]
) -> Iterator[tuple[httpx.Client, dict[str, str], dict[str, str]]]:
    """A server over `data_dir` with the sets' collections ingested (once: a kept data dir
    is reused, and gains the sets it lacks): the client, the bench tenant's headers, and the
    collection ids by set."""
    data_dir.mkdir(parents=True, exist_ok=True)
    listing = data_dir / "bench-collections.json"
    port = free_port()
    proc = start_server(data_dir, port)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        wait_ready(client, proc, 300)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        if not listing.exists():
            key = client.post("/v1/keys", json={"tenant": "bench"}, headers=admin).json()["key"]
            listing.write_text(json.dumps({"key": key}))
        saved = json.loads(listing.read_text())
        h = {"Authorization": f"Bearer {saved['key']}"}
        t = time.perf_counter()
        for s in [s for s in sets if s not in saved]:
            saved[s] = client.post("/v1/collections", json={"name": s}, headers=h).json()["id"]
            if s == "wiki":
                ingest_wiki(client, h, saved[s], docs)
            elif s == "wiki2":
                ingest_wiki(client, h, saved[s], wiki_docs("wiki2_collection.txt"))
            elif s == "company2":
                ingest_files(client, h, saved[s], HERE / "qa" / "company2")
            else:
                ingest_company(client, h, saved[s], data_dir / "company-docs")
            print(f"{s} ingested in {time.perf_counter() - t:.0f} s", flush=True)
            listing.write_text(json.dumps(saved))
        yield client, h, saved
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


# ---------------------------------------------------------------- asking


def ask(client: httpx.Client, h: dict[str, str], cid: str, q: Question, config: str,
        given_before: set[int]) -> Outcome:  # fmt: skip
    out = Outcome(q, config)
    body = {"question": q.question, "stream": True, **CONFIGS[config]}
    tokens = 0
    t0 = time.perf_counter()
    final: dict[str, Any] = {}
    try:
        with client.stream("POST", f"/v1/collections/{cid}/ask", json=body, headers=h) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}"
                return out
            for event, data in events(r):
                if event == "passages":
                    out.given_chunks = [p["chunk_id"] for p in data["passages"]]
                elif event == "token":
                    tokens += 1
                    now = (time.perf_counter() - t0) * 1000
                    if tokens == 1:
                        out.ttft_ms = now
                    elif tokens == 2:
                        out.generated_ms = now
                elif event == "final":
                    final = data
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
        return out
    out.answer = final.get("answer", "")
    out.source = final.get("answer_source", "")
    out.finish = final.get("finish_reason", "")
    out.cited_files = [c["filename"] for c in final.get("citations", [])]
    out.echoed = bool(final.get("echoed"))
    out.seen = bool(out.given_chunks) and set(out.given_chunks) <= given_before
    if out.source != "generated":
        out.generated_ms = None
    return out


# ---------------------------------------------------------------- scoring

_MARKERS = re.compile(r"\[\d{1,4}(?:\s*,\s*\d{1,4})*\]")


def first_sentences(answer: str, n: int = 2) -> str:
    text = _MARKERS.sub(" ", answer)
    pieces = [p.strip() for block in text.split("\n") for p in segment("en", block) if p.strip()]
    return " ".join(pieces[:n])


def stands(phrase: str, text: str) -> bool:
    words = [re.escape(w) for w in phrase.split()]
    pattern = r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)"
    return re.search(pattern, text, re.IGNORECASE) is not None


def correct(o: Outcome) -> bool:
    return holds(o.answer, o.q.answers, o.q.wrong)


def holds(answer: str, answers: Sequence[str], wrong: Sequence[str]) -> bool:
    """An accepted string stands in the answer's first two sentences, and no wrong one."""
    head = " ".join(first_sentences(answer).split())
    return any(stands(a, head) for a in answers) and not any(stands(w, head) for w in wrong)


def refused(o: Outcome) -> bool:
    return o.source == "refused"


def pct(values: Sequence[float], q: float) -> float:
    xs = sorted(v for v in values if v == v)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summary(outs: Sequence[Outcome]) -> dict[str, float]:
    ans = [o for o in outs if o.q.answerable]
    una = [o for o in outs if not o.q.answerable]
    cites = [f for o in ans for f in o.cited_files]
    gold_cites = sum(f == o.q.gold for o in ans for f in o.cited_files)
    para = [o for o in ans if o.q.paraphrased]
    return {
        "n": len(ans),
        "correct": sum(map(correct, ans)) / max(1, len(ans)),
        "cited": sum(o.q.gold in o.cited_files for o in ans) / max(1, len(ans)),
        "precision": gold_cites / max(1, len(cites)),
        "paraphrased": sum(map(correct, para)) / max(1, len(para)),
        "n_una": len(una),
        "refused": sum(map(refused, una)) / max(1, len(una)),
        "false_refusals": sum(map(refused, ans)) / max(1, len(ans)),
        "generated": sum(o.source == "generated" for o in ans) / max(1, len(ans)),
        "loops": sum(o.finish == "repetition" for o in outs),
        "echoes": sum(o.echoed for o in outs),
        "errors": sum(bool(o.error) for o in outs),
    }


def table(results: dict[str, list[Outcome]], sets: Sequence[str]) -> str:
    head = ("| set | half | setting | correct | cited | citation precision | paraphrased "
            "correct | refused (unanswerable) | false refusals | with a generated sentence "
            "| errors |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for s in sets:
        for half in ("a", "b", "both"):
            for config, outs in results.items():
                mine = [o for o in outs if o.q.set == s and (half == "both" or o.q.half == half)]
                m = summary(mine)
                lines.append(
                    f"| {s} | {half} | {config} | {m['correct']:.3f} ({m['n']}) | "
                    f"{m['cited']:.3f} | {m['precision']:.3f} | {m['paraphrased']:.3f} | "
                    f"{m['refused']:.3f} ({m['n_una']}) | {m['false_refusals']:.3f} | "
                    f"{m['generated']:.3f} | {m['errors']} |"
                )
    return "\n".join(lines)


def latency(outs: Sequence[Outcome]) -> str:
    lines = ["| answers | n | first token p50 ms | p90 | generated sentence p50 ms | p90 |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for label, group in (("unseen", [o for o in outs if not o.seen]),
                         ("seen", [o for o in outs if o.seen])):  # fmt: skip
        live = [o for o in group if o.source != "refused" and not o.error]
        gen = [o.generated_ms for o in live if o.generated_ms is not None]
        lines.append(
            f"| {label} | {len(live)} | {pct([o.ttft_ms for o in live], 50):.1f} | "
            f"{pct([o.ttft_ms for o in live], 90):.1f} | {pct(gen, 50):.1f} | {pct(gen, 90):.1f} |"
        )
    return "\n".join(lines)


def dump(path: Path, results: dict[str, list[Outcome]]) -> None:
    with path.open("w") as f:
        for outs in results.values():
            for o in outs:
                f.write(json.dumps({
                    "config": o.config, "set": o.q.set, "id": o.q.qid, "half": o.q.half,
                    "question": o.q.question, "answers": o.q.answers, "wrong": o.q.wrong,
                    "gold": o.q.gold, "answer": o.answer, "source": o.source,
                    "finish": o.finish, "cited": o.cited_files, "correct": correct(o),
                    "ttft_ms": round(o.ttft_ms, 1), "seen": o.seen, "error": o.error,
                }) + "\n")  # fmt: skip


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--every", type=int, help="ask every n-th question (default 1, quick 3)")
    ap.add_argument("--sets", default="wiki,company")
    ap.add_argument("--configs", default="default,extractive")
    ap.add_argument("--dump", help="write every answer as JSON lines here")
    ap.add_argument("--keep", help="use (and keep) this data dir: a second run skips ingest")
    args = ap.parse_args()
    every = args.every or (3 if args.quick else 1)
    sets = args.sets.split(",")
    configs = args.configs.split(",")

    docs = wiki_docs()
    questions = questions_of(sets, every, docs)

    tmp = tempfile.TemporaryDirectory()
    data_dir = Path(args.keep or tmp.name)
    with served(data_dir, sets, docs) as (client, h, saved):
        results: dict[str, list[Outcome]] = {}
        for config in configs:
            given: set[int] = set()
            outs = []
            t = time.perf_counter()
            for q in questions:
                o = ask(client, h, saved[q.set], q, config, given)
                given |= set(o.given_chunks)
                outs.append(o)
            results[config] = outs
            print(f"{config}: {len(outs)} questions in {time.perf_counter() - t:.0f} s",
                  flush=True)  # fmt: skip
    if args.dump:
        dump(Path(args.dump), results)

    print(f"\n{len(questions)} questions (every {every}), default settings over HTTP\n")
    print(table(results, sets))
    for config, outs in results.items():
        print(f"\n{config}: time to the first token event, and to the generated sentence\n")
        print(latency(outs))
    figures(results, sets)


def figures(results: dict[str, list[Outcome]], sets: Sequence[str]) -> None:
    d = results.get("default", [])
    m = summary(d)
    per_set = {s: summary([o for o in d if o.q.set == s]) for s in sets}
    print()
    print(f"FIGURE factual_correct {min(v['correct'] for v in per_set.values()):.3f}")
    print(f"FIGURE factual_cited {min(v['cited'] for v in per_set.values()):.3f}")
    print(f"FIGURE citation_precision {m['precision']:.3f}")
    print(f"FIGURE refusal_rate {m['refused']:.3f}")
    print(f"FIGURE false_refusal_rate {m['false_refusals']:.3f}")
    print(f"FIGURE loops {m['loops']}")
    print(f"FIGURE echoes {m['echoes']}")
    if "extractive" in results:
        gaps = []
        for s in sets:
            ex = summary([o for o in results["extractive"] if o.q.set == s])
            gaps.append(per_set[s]["correct"] - ex["correct"])
        print(f"FIGURE correct_vs_extractive {min(gaps):+.3f}")
    live = [o for o in d if o.source != "refused" and not o.error]
    unseen = [o.ttft_ms for o in live if not o.seen]
    seen = [o.ttft_ms for o in live if o.seen]
    print(f"FIGURE ttft_p50_unseen_ms {pct(unseen, 50):.1f}")
    print(f"FIGURE ttft_p50_seen_ms {pct(seen, 50):.1f}")


if __name__ == "__main__":
    main()
