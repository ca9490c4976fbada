"""One hostile client against eight honest ones: does a request-level attack hurt anyone else?

    python bench/abuse.py            # 1,000 documents, 30 s a phase
    python bench/abuse.py --quick    # 200 documents, 12 s a phase (< 10 min on 2 cores)
    python bench/abuse.py --quick --hash --fake-generator --docs 30 --phase-s 3   # smoke test

The API runs as its own process on loopback (`abuse.py serve`, the real app: SQLite, the
in-process worker, the bundled all-MiniLM-L6-v2 and SmolLM2 unless --hash / --fake-generator,
which say so in the output). Documents come from ../shared/data/wiki_vital (beside the
checkout). Eight honest clients search (70%) and ask (30%, short answers) without pause; a
probe reads /readyz twice a second. The first phase has no attack (the baseline); in each
later phase one hostile client (another tenant) sends one attack, bounded in count and time.

Per phase: honest requests that failed (any non-2xx, 429 included, and a /readyz that was not
200), honest p99 against the baseline's (search and ask apart; the ratio is the worse), server
errors (5xx to anyone), and the API process's peak memory over its idle memory. Last, the
purge: a document is deleted and the data dir's files are searched for its words and vector
bytes (tests/support/leftovers.py) until the purge has run. A heartbeat asks /healthz every
10 ms from a process of its own: its slowest answer in a phase is how long the event loop
stalled. In the keyword phase the honest tenant's keyword scores for a few queries are taken
before and after the attacker ingests the same words. Ends with

    FIGURE honest_failures <n>       summed over the attack phases
    FIGURE honest_p99_ratio <x>      the worst phase
    FIGURE server_errors <n>         every phase, every client
    FIGURE purge_leftovers <n>       bytes of the deleted document still found (nan: no purge)
    FIGURE loop_stall_max_ms <x>     the slowest /healthz over the attack phases
    FIGURE cross_tenant_signal <n>   honest keyword scores that moved with another's ingest
    FIGURE vectors_lost <n>          |index count - SQL count| over both tenants' indexes, at
                                     the end (after delete/purge/re-upload cycles, rebuilds)
    FIGURE readyz_p99_ms <x>         /readyz's p99 while the attacker floods it (and rebuilds)
    FIGURE readyz_not_ready <n>      503s from /readyz in that phase, honest load still served
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _attacks import ATTACKS, Hostile, Phase  # noqa: E402
from _data import shared  # noqa: E402
from _stats import pct  # noqa: E402

ADMIN_KEY = "bench-admin-key-0123456789"
MARKERS = ["quokkazanzibarflumph", "brontidemarquetry"]  # words no other document has


# ---------------------------------------------------------------- the server process


class FakeGenerator:
    """A stand-in generator (--fake-generator): streams 16 words, 5 ms apart, as a small
    model decoding would; it never reads the prompt past counting it."""

    def __init__(self) -> None:
        self.running: set[str] = set()

    @property
    def context_tokens(self) -> int:
        return 8192

    def count_tokens(self, prompt: Any) -> int:
        from rag.engine.protocol import estimate_tokens

        return estimate_tokens(prompt if isinstance(prompt, str | list) else str(prompt))

    def has_room(self) -> bool:
        return len(self.running) < 64

    def step_alive(self) -> bool:
        return True  # no step thread to die (/readyz asks once the generator is loaded)

    def submit(self, prompt: Any, params: Any = None, request_id: str | None = None, **_: Any):  # type: ignore[no-untyped-def]
        return self._stream(request_id or "fake")

    async def _stream(self, rid: str) -> AsyncIterator[Any]:
        import asyncio

        from rag.engine import FinishReason, TokenEvent, Usage

        self.running.add(rid)
        try:
            for i in range(16):
                await asyncio.sleep(0.005)
                yield TokenEvent(rid, " word" if i else "The answer [1]", (i,))
            yield TokenEvent(rid, "", (), FinishReason.STOP, Usage(100, 0, 16))
        finally:
            self.running.discard(rid)

    def cancel(self, request_id: str) -> None:
        self.running.discard(request_id)

    def drop_chunks(self, chunk_ids: set[int]) -> None:
        pass  # it caches nothing

    def metrics(self) -> Any:
        from rag.engine import EngineMetrics

        return EngineMetrics(0, 0, 0, 0, 0, 0.0, 0, 0, 0.0, 0)

    def close(self) -> None:
        pass


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rag.api.app import create_app
    from rag.config import Settings
    from rag.services import build_services

    settings = Settings(
        data_dir=Path(args.data),
        auth={"admin_key": ADMIN_KEY},
        embed={"backend": "hash"} if args.hash else {},
        purge={"interval_s": 2.0},
        log_level="WARNING",
    )
    engine = FakeGenerator() if args.fake_generator else None
    services = build_services(settings, engine=engine, announce_admin_key=False)  # type: ignore[arg-type]
    uvicorn.run(
        create_app(settings, services, freeze_heap=True), host="127.0.0.1", port=args.port,
        log_level="warning", access_log=False,
        timeout_keep_alive=settings.api.advanced.keep_alive_s,  # as `rag serve` has it
    )  # fmt: skip
    return 0


class Server:
    def __init__(self, data_dir: Path, args: argparse.Namespace) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, __file__, "serve", "--data", str(data_dir), "--port",
                    str(self.port)]  # fmt: skip
        self.cmd += ["--hash"] if args.hash else []
        self.cmd += ["--fake-generator"] if args.fake_generator else []
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the API process exited with {self.proc.returncode}")
            try:
                httpx.get(f"{self.url}/healthz", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("the API process did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


class Memory:
    """The API process's resident memory: its peak over a phase (VmHWM, reset per phase
    where the kernel allows, and samples every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _status(self, field_: str) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(field_ + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def rss(self) -> int:
        return self._status("VmRSS")

    def reset(self) -> None:
        with contextlib.suppress(OSError):  # "5" resets the peak (VmHWM) to the current RSS
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self.peak = self.rss()

    def phase_peak(self) -> int:
        return max(self.peak, self._status("VmHWM") if self._hwm_resettable() else 0)

    def _hwm_resettable(self) -> bool:
        return os.access(f"/proc/{self.pid}/clear_refs", os.W_OK)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.rss())

    def close(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------- the clients


class Load:
    """The honest clients and the probe, recording into the current phase."""

    def __init__(self, url: str, key: str, cid: str, questions: list[str], max_tokens: int):
        self.url, self.cid, self.questions, self.max_tokens = url, cid, questions, max_tokens
        self.headers = {"Authorization": f"Bearer {key}"}
        self.phase: Phase | None = None
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(8)]  # fmt: skip
        self.threads.append(threading.Thread(target=self._probe, daemon=True))
        self.threads.append(threading.Thread(target=self._heartbeat, daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)

    def _client(self, i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=120) as client:
            while not self.stop.is_set():
                phase = self.phase
                if phase is None:
                    time.sleep(0.05)
                    continue
                q = rng.choice(self.questions)
                kind = "ask" if rng.random() < 0.3 else "search"
                body: dict[str, Any] = {"query": q, "k": 5}
                if kind == "ask":
                    body = {"question": q, "max_tokens": self.max_tokens, "budget_ms": 60_000}
                t0 = time.perf_counter()
                try:
                    r = client.post(f"/v1/collections/{self.cid}/{kind}", json=body)
                    status = r.status_code
                except httpx.HTTPError:
                    status = 599  # no answer at all
                # Counted in the phase it started in (a slow answer that ends in the next
                # phase is still this one's p99).
                phase.honest(kind, status, time.perf_counter() - t0)

    def _probe(self) -> None:
        # From an address of its own, as a prober's (the attacker's is 127.0.0.1): requests
        # without a key are paced by address.
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=self.url, timeout=30, transport=transport) as client:
            while not self.stop.wait(0.5):
                phase = self.phase
                if phase is None:
                    continue
                try:
                    status = client.get("/readyz").status_code
                except httpx.HTTPError:
                    status = 599
                if status != 200:
                    with phase.lock:
                        phase.honest_failed[f"readyz {status}"] += 1

    def _heartbeat(self) -> None:
        """/healthz every 10 ms from a process of its own (`abuse.py beat`): a tiny request
        the event loop answers at once, so its slowest answer is the longest the loop
        stalled (a regex or parser holding the GIL, a burst of requests). In this process
        it waited for the GIL behind the clients' and the attacker's threads, and measured
        them as much as the server."""
        beat = subprocess.Popen(
            [sys.executable, __file__, "beat", self.url], stdout=subprocess.PIPE, text=True
        )
        assert beat.stdout is not None
        try:
            for line in beat.stdout:
                if self.stop.is_set():
                    break
                phase = self.phase
                if phase is None:
                    continue
                ms = float(line)
                with phase.lock:
                    phase.loop_stall_ms = max(phase.loop_stall_ms, ms)
        finally:
            beat.kill()
            beat.wait()


def beat(url: str) -> int:
    """The heartbeat's process: the time of each /healthz, in ms, a line each (from an address
    of its own, as the probe's)."""
    transport = httpx.HTTPTransport(local_address="127.0.0.3")
    with httpx.Client(base_url=url, timeout=120, transport=transport) as client:
        while True:
            time.sleep(0.01)
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                client.get("/healthz")
            print(f"{(time.perf_counter() - t0) * 1000:.2f}", flush=True)


# ---------------------------------------------------------------- the run


def load_docs(n: int) -> list[dict[str, Any]]:
    docs = []
    with shared("wiki_vital", "passages.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            docs.append({"text": row["text"][:1500], "filename": row["title"][:100] + ".txt"})
            if len(docs) >= n:
                break
    if len(docs) < n:
        raise SystemExit(f"wiki_vital holds {len(docs)} passages; {n} were asked for")
    return docs


def upload(client: httpx.Client, cid: str, docs: list[dict[str, Any]]) -> list[str]:
    jobs = []
    for at in range(0, len(docs), 100):
        r = client.post(f"/v1/collections/{cid}/documents", json={"documents": docs[at : at + 100]})
        r.raise_for_status()
        jobs += [d["job_id"] for d in r.json()["documents"] if d["job_id"]]
    return jobs


def wait_jobs(client: httpx.Client, jobs: list[str], timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    for job in jobs:
        while True:
            r = client.get(f"/v1/jobs/{job}", params={"wait": 30})
            if r.status_code == 200 and r.json()["done"]:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"ingest did not finish in {timeout_s:.0f} s")
            if r.status_code == 429:
                time.sleep(1)


def purge_leftovers(client: httpx.Client, data_dir: Path, cid: str) -> float:
    """Bytes of a deleted document still in the data dir's files once the purge has had its
    time; nan where there is no purge to verify."""
    try:
        import rag.purge  # noqa: F401  (the purge exists in this checkout)
        from rag.db import Database
        from tests.support.leftovers import document_needles, leftover_bytes, scan
    except ImportError:
        return float("nan")
    text = f"The {MARKERS[0]} keeps its {MARKERS[1]} in the archive. " * 20
    r = client.post(f"/v1/collections/{cid}/documents", json={"text": text})
    r.raise_for_status()
    item = r.json()["documents"][0]
    wait_jobs(client, [item["job_id"]])
    db = Database(f"sqlite:///{data_dir / 'rag.db'}")
    try:
        needles = document_needles(db, item["document_id"], markers=MARKERS)
    finally:
        db.dispose()
    client.delete(f"/v1/documents/{item['document_id']}").raise_for_status()
    left = leftover_bytes(scan(data_dir, needles))
    deadline = time.monotonic() + 120
    while left and time.monotonic() < deadline:
        time.sleep(2)
        left = leftover_bytes(scan(data_dir, needles))
    return float(left)


def vectors_lost(data_dir: Path, clients: dict[str, httpx.Client]) -> int:
    """Each collection's live index (as the server reports it on a search, which catches the
    index up first) against its live chunks in SQL, as `rag index check` compares; asked
    again for up to 60 s while the two differ (a rebuild or catch-up still running)."""
    from rag.db import Database, chunks, collections

    db = Database(f"sqlite:///{data_dir / 'rag.db'}")
    lost = 0
    try:
        for cid, client in clients.items():
            deadline = time.monotonic() + 60
            while True:
                r = client.post(f"/v1/collections/{cid}/search", json={"query": "x", "k": 1})
                r.raise_for_status()
                index = r.json()["index"]
                with db.read() as session:
                    row = collections.get_live(session, cid)
                    assert row is not None
                    sql = chunks.live_count(session, cid, row.embedding_model)
                settled = not index["building"] and not index["stale"]
                if settled and sql == index["count"] or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            lost += abs(sql - int(index["count"]))
    finally:
        db.dispose()
    return lost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 documents, 12 s a phase")
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--phase-s", type=float, default=None, help="seconds a phase")
    ap.add_argument("--hash", action="store_true", help="the hash embedder (no model)")
    ap.add_argument("--fake-generator", action="store_true", help="a 5 ms/token stand-in")
    ap.add_argument("--only", default=None, help="run only attacks whose name has this")
    args = ap.parse_args()
    n_docs = args.docs or (200 if args.quick else 1000)
    phase_s = args.phase_s or (12.0 if args.quick else 30.0)
    max_tokens = 16 if args.quick else 32
    docs = load_docs(n_docs)
    questions = [d["text"].split(".")[0][:200] for d in docs]
    print(f"embedder: {'hash (no model)' if args.hash else 'all-MiniLM-L6-v2'}; generator: "
          f"{'a 5 ms/token fake' if args.fake_generator else 'SmolLM2-135M (the engine)'}; "
          f"{n_docs} documents; {phase_s:g} s a phase", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rag-abuse-") as tmp, Server(Path(tmp), args) as srv:
        assert srv.proc is not None
        admin = httpx.Client(base_url=srv.url, timeout=120,
                             headers={"Authorization": f"Bearer {ADMIN_KEY}"})  # fmt: skip
        keys = {}
        for tenant in ("honest", "hostile"):
            r = admin.post("/v1/keys", json={"tenant": tenant})
            r.raise_for_status()
            keys[tenant] = r.json()["key"]
        honest = httpx.Client(base_url=srv.url, timeout=600,
                              headers={"Authorization": f"Bearer {keys['honest']}"})  # fmt: skip
        hostile = httpx.Client(base_url=srv.url, timeout=120,
                               headers={"Authorization": f"Bearer {keys['hostile']}"})  # fmt: skip
        cid = honest.post("/v1/collections", json={"name": "honest"}).json()["id"]
        bad_cid = hostile.post("/v1/collections", json={"name": "mine"}).json()["id"]
        t0 = time.monotonic()
        wait_jobs(honest, upload(honest, cid, docs))
        bad_jobs = upload(hostile, bad_cid, docs[:20])
        wait_jobs(hostile, bad_jobs)
        print(f"ingested in {time.monotonic() - t0:.0f} s", flush=True)
        # Warm what the first request would otherwise pay (the generator's load).
        honest.post(f"/v1/collections/{cid}/ask", json={"question": questions[0], "max_tokens": 4})
        memory = Memory(srv.proc.pid)
        time.sleep(1)
        idle = memory.rss()
        load = Load(srv.url, keys["honest"], cid, questions, max_tokens)
        load.start()
        phases: list[Phase] = []
        attacks = [(name, fn) for name, fn in ATTACKS if not args.only or args.only in name]
        for name, attack in [("(none: baseline)", None), *attacks]:
            phase = Phase(name)
            memory.reset()
            load.phase = phase
            until = time.monotonic() + phase_s
            if attack is not None:
                h = Hostile(hostile, srv.url, bad_cid, cid, bad_jobs[-1], until, phase, honest)
                attack(h)
            time.sleep(max(0.0, until - time.monotonic()))
            load.phase = None
            time.sleep(0.5)  # requests of this phase finish out of it
            phase.peak_rss = memory.phase_peak()
            phases.append(phase)
            print(f"  {name}: {phase.honest_ok} honest ok, {sum(phase.honest_failed.values())} "
                  f"failed, hostile {dict(phase.hostile)}", flush=True)  # fmt: skip
        load.close()
        memory.close()
        lost = vectors_lost(Path(tmp), {cid: honest, bad_cid: hostile})
        leftovers = purge_leftovers(honest, Path(tmp), cid)
        for c in (admin, honest, hostile):
            c.close()

    base = phases[0]
    print()
    print("| attack | honest ok | honest failed | search p99 ms | ask p99 ms | p99 ratio | "
          "server errors | peak RSS over idle MB | loop stall ms | hostile answers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for ph in phases:
        ratios = [pct(ph.latencies[k], 99) / pct(base.latencies[k], 99) for k in ("search", "ask")
                  if ph.latencies[k] and base.latencies[k]]  # fmt: skip
        ratio = max(ratios) if ratios else float("nan")
        if ph is not base and ratios:
            worst = max(worst, ratio)
        failed = ", ".join(f"{k}: {v}" for k, v in ph.honest_failed.items()) or "0"
        hostile_answers = ", ".join(f"{s}: {n}" for s, n in sorted(ph.hostile.items())) or "-"
        print(f"| {ph.name} | {ph.honest_ok} | {failed} | {pct(ph.latencies['search'], 99):.0f} "
              f"| {pct(ph.latencies['ask'], 99):.0f} | {ratio:.2f} | {ph.server_errors} | "
              f"{(ph.peak_rss - idle) / 2**20:.0f} | {ph.loop_stall_ms:.0f} | "
              f"{hostile_answers} |")  # fmt: skip
    print(
        f"\nidle RSS {idle / 2**20:.0f} MB; p99 ratio: the phase's p99 over the baseline's, "
        "the worse of search and ask"
    )
    print(f"FIGURE honest_failures {sum(sum(p.honest_failed.values()) for p in phases[1:])}")
    print(f"FIGURE honest_p99_ratio {worst:.2f}")
    print(f"FIGURE server_errors {sum(p.server_errors for p in phases)}")
    print(f"FIGURE purge_leftovers {leftovers:.0f}" if leftovers == leftovers
          else "FIGURE purge_leftovers nan")  # fmt: skip
    print(f"FIGURE loop_stall_max_ms {max(p.loop_stall_ms for p in phases[1:]):.0f}")
    print(f"FIGURE cross_tenant_signal {sum(p.signal for p in phases)}")
    print(f"FIGURE vectors_lost {lost}")
    readyz = [ms for p in phases for ms in p.readyz_ms]
    print(f"FIGURE readyz_p99_ms {pct(readyz, 99):.0f}")
    print(f"FIGURE readyz_not_ready {sum(p.readyz_not_ready for p in phases)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "beat":
        sys.exit(beat(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        p = argparse.ArgumentParser()
        p.add_argument("serve")
        p.add_argument("--data", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--hash", action="store_true")
        p.add_argument("--fake-generator", action="store_true")
        sys.exit(serve(p.parse_args()))
    sys.exit(main())
