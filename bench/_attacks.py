"""The hostile tenant's attacks of bench/abuse.py, and the phase they are counted in.

Each attack is a function of a `Hostile` (the attacker's client, its own collection, the
honest tenant's collection id, which it may name but never see, and the phase's deadline);
each sends one kind of abuse, bounded in count and time, and counts every answer it gets in
the phase (a 5xx, or no answer at all, is a server error). ATTACKS lists them in the order
bench/abuse.py runs them, one a phase.
"""

from __future__ import annotations

import io
import json
import random
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx


class Answer(NamedTuple):
    status: int  # 0: the client gave up at its timeout; 599: no answer at all
    ms: float


@dataclass
class Phase:
    name: str
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"search": [], "ask": []})
    honest_failed: Counter[str] = field(default_factory=Counter)
    honest_ok: int = 0
    server_errors: int = 0
    hostile: Counter[int] = field(default_factory=Counter)
    peak_rss: int = 0
    loop_stall_ms: float = 0.0  # the slowest /healthz of the phase
    signal: int = 0  # honest keyword scores another tenant's ingest moved
    readyz_ms: list[float] = field(default_factory=list)  # the attacker's flood of /readyz
    readyz_not_ready: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def honest(self, kind: str, status: int, seconds: float) -> None:
        with self.lock:
            if 200 <= status < 300:
                self.honest_ok += 1
                self.latencies.setdefault(kind, []).append(seconds * 1000)
            else:
                self.honest_failed[f"{kind} {status}"] += 1
            if status >= 500:
                self.server_errors += 1

    def attacker(self, status: int) -> None:
        with self.lock:
            self.hostile[status] += 1
            if status >= 500:
                self.server_errors += 1


@dataclass
class Hostile:
    client: httpx.Client  # the hostile tenant's key
    url: str
    cid: str  # its own collection
    honest_cid: str  # another tenant's, which it may name but never see
    job_id: str  # a job of its own
    until: float
    phase: Phase
    observer: httpx.Client | None = None  # the honest tenant's own client, to compare scores

    def live(self) -> bool:
        return time.monotonic() < self.until

    def send(self, method: str, path: str, **kwargs: Any) -> int:
        try:
            status = self.client.request(method, path, **kwargs).status_code
        except httpx.HTTPError as exc:
            status = 599
            _no_answer(exc)
        self.phase.attacker(status)
        return status

    def repeat(self, times: int, fn: Callable[[], object]) -> None:
        for _ in range(times):
            if not self.live():
                return
            fn()

    def flood(self, workers: int, times: int, requests: list[dict[str, Any]]) -> list[Answer]:
        """`workers` concurrent connections, each sending up to `times` requests (method, url,
        optional params, json and timeout), taking `requests` in turn, until the phase ends;
        every answer is counted, and returned with its time. From a process of its own
        (bench/_flood.py), as from an attacker's own machine: in this one its client held the
        GIL the honest clients need to read their answers."""
        auth = self.client.headers.get("authorization")
        spec = {"url": self.url, "headers": {"authorization": auth} if auth else {},
                "workers": workers, "times": times, "requests": requests,
                "seconds": max(0.0, self.until - time.monotonic())}  # fmt: skip
        child = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("_flood.py"))],
            input=json.dumps(spec), capture_output=True, text=True, check=False,
        )  # fmt: skip
        if child.returncode != 0:
            raise RuntimeError(f"the flood's process failed: {child.stderr[-2000:]}")
        if child.stderr:
            print(child.stderr.strip(), file=sys.stderr)
        answers = [Answer(int(s), float(ms)) for s, ms in json.loads(child.stdout)["answers"]]
        for a in answers:
            self.phase.attacker(a.status)
        return answers

    def status_of(self, fn: Callable[[], httpx.Response]) -> None:
        try:
            status = fn().status_code
        except httpx.HTTPError:
            status = 599
        self.phase.attacker(status)


_SAID: set[str] = set()


def _no_answer(exc: Exception) -> None:
    """Say once per kind why a request got no answer (counted as 599, a server error)."""
    what = f"{type(exc).__name__}: {exc}"[:200]
    if what not in _SAID:
        _SAID.add(what)
        print(f"    no answer: {what}", flush=True)


def chat(h: Hostile, **body: Any) -> int:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **body}
    return h.send("POST", "/v1/chat/completions", json=body)


def ask(h: Hostile, **body: Any) -> int:
    return h.send("POST", f"/v1/collections/{h.cid}/ask", json={"question": "x", **body})


def stop_strings(h: Hostile) -> None:
    many = ["stop here" * 7] * 10_000  # ~700 KB: the engine would scan each at every token
    h.repeat(100, lambda: chat(h, stop=many))
    h.repeat(100, lambda: ask(h, stop=many))


def huge_seed(h: Hostile) -> None:
    h.repeat(200, lambda: chat(h, seed=10**30, temperature=1.0, max_tokens=64))
    h.repeat(200, lambda: ask(h, seed=10**30, temperature=1.0))


def index_params(h: Hostile) -> None:
    bad = [
        {"kind": "hnsw", "params": {"initial_capacity": 10**8}},
        {"kind": "faiss_hnsw", "params": {"m": 10**6}},
        {"kind": "faiss_ivf", "params": {"nlist": 10**9}},
    ]
    rebuild = f"/v1/collections/{h.cid}/index/rebuild"
    for n in range(100):
        spec, name = bad[n % len(bad)], f"big-{n}"
        body = {"name": name, "index": spec}
        h.repeat(1, lambda b=body: h.send("POST", "/v1/collections", json=b))
        h.repeat(1, lambda s=spec: h.send("POST", rebuild, json=s))


def chat_messages(h: Hostile) -> None:
    fat = [{"role": "user", "content": "w " * 16_000}] * 30  # ~1 MB of text: over the limits
    h.repeat(50, lambda: chat(h, messages=fat))
    under_body = [{"role": "user", "content": "w " * 15_000}] * 8  # 240k chars, < 1 MiB
    h.repeat(100, lambda: chat(h, messages=under_body))


JSON = {"content-type": "application/json"}


def big_json_upload(h: Hostile) -> None:
    # 20 MB of JSON that fails at its very end: all of it is parsed (off the event loop).
    payload = b'{"text": "' + b"lorem ipsum " * 1_700_000 + b'", "oops": '
    url = f"/v1/collections/{h.cid}/documents"
    h.repeat(5, lambda: h.send("POST", url, content=payload, headers=JSON))


def big_bodies(h: Hostile) -> None:
    payload = b'{"query": "' + b"x" * (10 << 20) + b'"}'
    mine, theirs = f"/v1/collections/{h.cid}/search", f"/v1/collections/{h.honest_cid}/search"
    with httpx.Client(base_url=h.url, timeout=120) as anonymous:  # no key at all
        for _ in range(10):
            h.repeat(1, lambda: h.send("POST", mine, content=payload, headers=JSON))
            h.repeat(
                1,
                lambda: h.status_of(lambda: anonymous.post(theirs, content=payload, headers=JSON)),
            )


def validation_errors(h: Hostile) -> None:
    body = {"query": "x", **{f"k{i:06d}": i for i in range(60_000)}}  # ~1 MB of unknown keys
    h.repeat(50, lambda: h.send("POST", f"/v1/collections/{h.cid}/search", json=body))


def lying_docx(h: Hostile) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        names = ["[Content_Types].xml", "_rels/.rels", "word/document.xml"]
        for name in names + [f"word/media/{i}.xml" for i in range(20_000)]:
            z.writestr(name, "")
    data = bytearray(buf.getvalue())
    at = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, at + 8, 1, 1)  # declares 1 entry, holds 20,003
    files = [("files", ("memo.docx", bytes(data), "application/octet-stream"))]
    h.repeat(50, lambda: h.send("POST", f"/v1/collections/{h.cid}/documents", files=files))


def long_polls(h: Hostile) -> None:
    # Waiters on a job still queued (100 documents go in first); past the bound they are
    # refused; held ones end as their clients give up (2 s), which the server notices.
    docs = {"documents": [{"text": f"poll target {i} " + "words " * 200} for i in range(100)]}
    r = h.client.post(f"/v1/collections/{h.cid}/documents", json=docs)
    h.phase.attacker(r.status_code)
    job = r.json()["documents"][-1]["job_id"] if r.status_code == 202 else h.job_id
    poll = {"method": "GET", "url": f"/v1/jobs/{job}", "params": {"wait": 60}, "timeout": 2}
    h.flood(300, 3, [poll])


def thread_pools(h: Hostile) -> None:
    body = {"query": "a long query of many words " * 20, "k": 200, "exact": True, "hybrid": 0.5}
    search = {"method": "POST", "url": f"/v1/collections/{h.cid}/search", "json": body,
              "timeout": 60}  # fmt: skip
    listing = {"method": "GET", "url": "/v1/collections", "timeout": 60}
    h.flood(64, 1 << 20, [listing, search])  # back to back, all phase


def rebuilds(h: Hostile) -> None:
    def rebuild() -> None:
        h.send("POST", f"/v1/collections/{h.cid}/index/rebuild", json={"kind": "hnsw"})
        time.sleep(0.2)

    h.repeat(100, rebuild)


def upload_flood(h: Hostile) -> None:
    docs = {"documents": [{"text": f"flood document {i} " + "filler words " * 150}
                          for i in range(50)]}  # fmt: skip
    h.repeat(40, lambda: h.send("POST", f"/v1/collections/{h.cid}/documents", json=docs))


def _multipart(h: Hostile, files: list[tuple[str, bytes, str]]) -> int:
    parts = [("files", (name, data, kind)) for name, data, kind in files]
    return h.send("POST", f"/v1/collections/{h.cid}/documents", files=parts)


def bracket_runs(h: Hostile) -> None:
    # 64 KiB of `[` sniffed as text (the markdown hint once backtracked on it for seconds,
    # holding the GIL), 100 files a request; then markdown itself, parsed under the child's
    # limits. This phase's loop stall is the measure.
    runs = b"[" * 65_536
    h.repeat(5, lambda: _multipart(h, [(f"r{i}.txt", runs, "application/octet-stream")
                                       for i in range(100)]))  # fmt: skip
    h.repeat(2, lambda: _multipart(h, [("runs.md", b"[" * (1 << 20), "text/markdown")]))


def hostile_text(h: Hostile) -> None:
    # A 300,000-character word (one [UNK] token: one chunk, bounded only in tokens) and runs
    # the prompt's neutralising patterns backtracked on; then questions that quote them.
    text = ("x" * 300_000 + " " + "[" * 20_000 + " " + "![a](" * 4_000 + "\n" * 40_000
            + " " + "</passage" * 2_000)  # fmt: skip
    r = h.client.post(f"/v1/collections/{h.cid}/documents", json={"text": text})
    h.phase.attacker(r.status_code)
    h.repeat(20, lambda: ask(h, question="what does the passage say?", max_tokens=4))


def zip64_docx(h: Hostile) -> None:
    # A classic end record declaring 1 entry, and a ZIP64 record (which zipfile prefers)
    # giving the 20,003 the directory holds.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        names = ["[Content_Types].xml", "_rels/.rels", "word/document.xml"]
        for name in names + [f"word/media/{i}.xml" for i in range(20_000)]:
            z.writestr(name, "")
    data = buf.getvalue()
    at = data.rfind(b"PK\x05\x06")
    _total, size, offset = struct.unpack_from("<HII", data, at + 10)
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 20_003, 20_003,
                         size, offset)  # fmt: skip
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)
    end = bytearray(data[at:])
    struct.pack_into("<HHI", end, 8, 1, 1, len(record) + len(locator))
    crafted = data[:at] + record + locator + bytes(end)
    h.repeat(50, lambda: _multipart(h, [("memo.docx", crafted, "application/octet-stream")]))


KEYWORD_QUERIES = ["history of the city", "river and mountains", "war and the empire"]


def _keyword_scores(h: Hostile) -> list[list[tuple[int, float | None]]]:
    assert h.observer is not None
    out = []
    for q in KEYWORD_QUERIES:
        body = {"query": q, "k": 10, "hybrid": 0.5, "exact": True}
        r = h.observer.post(f"/v1/collections/{h.honest_cid}/search", json=body)
        passages = r.json()["passages"] if r.status_code == 200 else []
        out.append([(p["chunk_id"], p["keyword_score"]) for p in passages])
    return out


def keyword_signal(h: Hostile) -> None:
    # The attacker ingests the honest tenant's query words; with one shared FTS5 table the
    # honest tenant's BM25 scores moved (a signal of what another tenant holds).
    before = _keyword_scores(h)
    words = " ".join(KEYWORD_QUERIES)
    docs = {"documents": [{"text": f"{words} {i} " * 20} for i in range(50)]}
    r = h.client.post(f"/v1/collections/{h.cid}/documents", json=docs)
    h.phase.attacker(r.status_code)
    if r.status_code == 202:
        deadline = time.monotonic() + 60
        for item in r.json()["documents"]:
            while time.monotonic() < deadline:
                j = h.client.get(f"/v1/jobs/{item['job_id']}", params={"wait": 5})
                if j.status_code == 200 and j.json()["done"]:
                    break
    after = _keyword_scores(h)
    h.phase.signal = sum(1 for b, a in zip(before, after, strict=True) if b != a)


def _ingested(client: httpx.Client, body: dict[str, Any], url: str) -> tuple[int, list[str]]:
    """Upload, then wait (60 s at most) for every job: the status (599 when a job failed, 0
    when one was still waiting at the deadline: for the attacker, behind its own tenant's
    backlog, not the server's failure; for the honest tenant, an honest failure) and the
    documents' ids."""
    try:
        r = client.post(url, json=body)
    except httpx.HTTPError:
        return 599, []
    if r.status_code != 202:
        return r.status_code, []
    items = r.json()["documents"]
    deadline = time.monotonic() + 60
    for item in items:
        while True:
            j = client.get(f"/v1/jobs/{item['job_id']}", params={"wait": 5})
            if j.status_code == 200 and j.json()["done"]:
                if j.json()["state"] != "done":
                    print(f"    job {item['job_id']} {j.json()['state']}: "
                          f"{j.json().get('error')}", flush=True)  # fmt: skip
                    return 599, []
                break
            if time.monotonic() > deadline:
                print(f"    job {item['job_id']} not done in 60 s: {j.text[:300]}", flush=True)
                return 0, []
    return 202, [item["document_id"] for item in items]


def purge_cycles(h: Hostile) -> None:
    # Item 1: the same bytes uploaded, deleted, purged (the bench's purge runs every 2 s) and
    # uploaded again, in the attacker's own collection; a reused chunk id or an erase that
    # took a live id leaves the index short of SQL (FIGURE vectors_lost, at the end).
    docs = {"documents": [{"text": f"cycle {i} " + "recycled words " * 60} for i in range(5)]}
    url = f"/v1/collections/{h.cid}/documents"
    cycles = 0
    while cycles == 0 or h.live():
        status, ids = _ingested(h.client, docs, url)
        h.phase.attacker(status)
        for doc_id in ids:
            h.send("DELETE", f"/v1/documents/{doc_id}")
        time.sleep(2.5)  # one purge round
        cycles += 1
    status, _ = _ingested(h.client, docs, url)  # live again: all their vectors indexed
    h.phase.attacker(status)


def ask_flood(h: Hostile) -> None:
    # Item 10: answers' retrieval runs on the search threads in the tenant's line; 32
    # connections of asks wait there (or get 429) while the honest tenant's asks go on.
    body = {"question": "what do the recycled words say?", "max_tokens": 16, "budget_ms": 60_000}
    req = {"method": "POST", "url": f"/v1/collections/{h.cid}/ask", "json": body, "timeout": 60}
    h.flood(32, 100, [req])


def _honest_churn(h: Hostile) -> None:
    """The honest tenant uploads a document, waits for it, and deletes it, until the phase
    ends: each step an honest request (`upload` counts until its job is done)."""
    assert h.observer is not None
    url = f"/v1/collections/{h.honest_cid}/documents"
    n = 0
    while h.live():
        body = {"text": f"churn {n} {random.random()} " + "honest words " * 80}
        t0 = time.perf_counter()
        status, ids = _ingested(h.observer, body, url)
        h.phase.honest("upload", status, time.perf_counter() - t0)
        for doc_id in ids:
            t0 = time.perf_counter()
            try:
                status = h.observer.delete(f"/v1/documents/{doc_id}").status_code
            except httpx.HTTPError:
                status = 599
            h.phase.honest("delete", status, time.perf_counter() - t0)
        n += 1


def rebuilds_during_churn(h: Hostile) -> None:
    # Item 11: rebuilds started back to back (its own collection, and the honest one's id,
    # which must be 404) while the honest tenant uploads and deletes.
    churn = threading.Thread(target=_honest_churn, args=(h,), daemon=True)
    churn.start()
    kinds = ["hnsw", "faiss_flat", "exact", "faiss_hnsw"]
    n = 0
    while h.live():
        h.send("POST", f"/v1/collections/{h.cid}/index/rebuild", json={"kind": kinds[n % 4]})
        h.send("POST", f"/v1/collections/{h.honest_cid}/index/rebuild", json={"kind": "hnsw"})
        n += 1
        time.sleep(0.05)
    churn.join(timeout=120)


def readyz_flood(h: Hostile) -> None:
    # Item 12: 32 connections of /readyz (no key needed) while the attacker rebuilds its
    # index: each answer must stay cheap (cached, one ping), and ready while the honest
    # load is served (a rebuild serves the old generation, so it is no reason for a 503).
    def rebuild_now_and_then() -> None:
        while h.live():
            h.send("POST", f"/v1/collections/{h.cid}/index/rebuild", json={"kind": "hnsw"})
            time.sleep(0.3)

    rebuilder = threading.Thread(target=rebuild_now_and_then, daemon=True)
    rebuilder.start()

    answers = h.flood(32, 1 << 20, [{"method": "GET", "url": "/readyz", "timeout": 30}])
    with h.phase.lock:
        h.phase.readyz_ms.extend(a.ms for a in answers)
        h.phase.readyz_not_ready += sum(a.status == 503 for a in answers)
    rebuilder.join(timeout=60)


ATTACKS: list[tuple[str, Callable[[Hostile], None]]] = [
    ("stop strings (10,000)", stop_strings),
    ("seed 10**30", huge_seed),
    ("index build params", index_params),
    ("chat messages (1 MB)", chat_messages),
    ("20 MB JSON upload", big_json_upload),
    ("10 MB JSON bodies", big_bodies),
    ("60,000 unknown keys", validation_errors),
    ("zip declaring 1 of 20,000", lying_docx),
    ("300 long polls", long_polls),
    ("64 connections of searches", thread_pools),
    ("rebuild storm", rebuilds),
    ("upload flood", upload_flood),
    ("runs of [ (sniffer, markdown)", bracket_runs),
    ("300,000-char word, prompt runs", hostile_text),
    ("ZIP64 docx of 20,003 entries", zip64_docx),
    ("another tenant's keywords", keyword_signal),
    ("delete, purge, re-upload cycles", purge_cycles),
    ("32 connections of asks", ask_flood),
    ("rebuilds while honest churn", rebuilds_during_churn),
    ("/readyz flood during rebuilds", readyz_flood),
]
