"""What watching quality costs: answers per second with answer recording, quality metrics and
the drift loop on, and with them off, on the same live service.

    python bench/quality_watch.py            # 6 pairs of 20 s runs
    python bench/quality_watch.py --quick    # 3 pairs of 8 s runs

The service (in this process, on loopback: rag.api.loopback) holds 60 wiki_vital summaries,
embedded by the bundled all-MiniLM-L6-v2; 16 clients ask the wiki dev set's questions over
HTTP, each as soon as its last answer came. Answers are extractive (no generator): the
cheapest answer path, so recording's share of each answer is the largest it can be.
Runs alternate on and off (the order flips every pair) and the ratio is taken per pair; the
drift loop runs every second while on (`--interval-s`; the service's default is every 15 s).

FIGURE watch_overhead: mean of the pairs' on/off answers-per-second ratios (goal >= 0.97),
with its standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # before bench/: bench/ingest.py is not the package

from _data import shared  # noqa: E402

from rag.api.app import create_app  # noqa: E402
from rag.api.loopback import LiveServer  # noqa: E402
from rag.auth import create_key  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.services import build_services  # noqa: E402

CLIENTS = 16


def load(url: str, headers: dict[str, str], cid: str, questions: list[str], seconds: float) -> int:
    """Answers completed by CLIENTS clients in `seconds`."""
    done = [0] * CLIENTS
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            n = i
            while time.monotonic() < stop:
                body = {"question": questions[n % len(questions)], "mode": "extractive"}
                r = c.post(f"/v1/collections/{cid}/ask", json=body)
                r.raise_for_status()
                done[i] += 1
                n += CLIENTS

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--interval-s", type=float, default=1.0, help="the drift loop's interval while on"
    )
    args = ap.parse_args()
    pairs, seconds = (3, 8.0) if args.quick else (6, 20.0)
    rows = [json.loads(line) for line in shared("wiki_vital", "passages.jsonl").open()]
    questions = [
        json.loads(line)["question"] for line in (HERE / "qa" / "wiki_factual.jsonl").open()
    ]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            auth={"admin_key": "bench-admin-key-0123456789"},
            engine={"load_at_start": False},
            quality={"interval_s": args.interval_s},
            quota={"max_concurrent_asks": 64},
        )
        services = build_services(settings, announce_admin_key=False)
        key, _ = create_key(services.db, "bench")
        headers = {"Authorization": f"Bearer {key}"}
        quality = services.quality
        with LiveServer(create_app(settings, services)) as server:
            c = httpx.Client(base_url=server.url, headers=headers, timeout=120)
            cid = c.post("/v1/collections", json={"name": "wiki"}).json()["id"]
            for r in rows[:60]:
                c.post(f"/v1/collections/{cid}/documents", json={"text": r["text"]})
            while c.get(f"/v1/collections/{cid}").json()["documents"].get("indexed", 0) < 60:
                time.sleep(0.5)
            load(server.url, headers, cid, questions, 2.0)  # warm
            ratios = []
            for p in range(pairs):
                rates = {}
                for on in (True, False) if p % 2 == 0 else (False, True):
                    services.quality = quality if on else None
                    rates[on] = load(server.url, headers, cid, questions, seconds) / seconds
                services.quality = quality
                ratios.append(rates[True] / rates[False])
                print(f"pair {p}: on {rates[True]:.1f}/s, off {rates[False]:.1f}/s, "
                      f"ratio {ratios[-1]:.3f}")  # fmt: skip
            assert quality is not None
            quality.recorder.flush()
            print(f"records written {quality.recorder.written}, dropped {quality.recorder.dropped}")
            c.close()
    mean = float(np.mean(ratios))
    se = float(np.std(ratios, ddof=1) / np.sqrt(len(ratios))) if len(ratios) > 1 else 0.0
    print(f"FIGURE watch_overhead {mean:.3f} (standard error {se:.3f}, {pairs} pairs, {CLIENTS} "
          "clients)")  # fmt: skip


if __name__ == "__main__":
    main()
