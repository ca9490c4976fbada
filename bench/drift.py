"""Question drift, content drift and unanswered topics, through the code /ask calls: answers
written by the recording code (rag.db.answers.insert) into a real SQLite database, tested by
the drift loop's own check (rag.quality.watch.Watch), clustered by rag.quality.topics.

    python bench/drift.py            # 5,000-question streams
    python bench/drift.py --quick    # 2,000-question streams (a few minutes on 2 cores)

Question streams (all-MiniLM-L6-v2 embeddings, the service's model): each wiki_vital topic
(the `topic` field, 12 values) and the company documents is a pool of texts: the factual dev
sets' questions (bench/qa, paraphrased ones among them) whose document has that topic, and the
first sentences of that topic's wiki_vital summaries (real text, not templates). Mix A draws
from six topics and the company set, mix B from the other six.

- stationary: every question from mix A; FIGURE drift_false_alarms counts alert onsets;
- shift: mix A, then mix B from the middle; FIGURE drift_detect_delay is the questions after
  the shift until the alert;
- gradual: mix A, then a linear ramp to mix B over 2,000 questions (1,000 with --quick);
  FIGURE gradual_detect_delay counts from the ramp's start.

Content drift (FIGURE content_drift_detected, 1 when an upload of 30 summaries from mix B's
topics alerts and one of 30 from mix A does not): the same test on document vectors, against
200 summaries of mix A.

Unanswered topics: 60 questions about Python and Perl (docfaq's FAQ questions; no document
of the collection covers them) mixed into 2,000 stream questions; a question is weak when its
best cosine against the collection's passages (mix A's texts) is under quality.advanced.weak_score,
as the ask path marks it. FIGURE unanswered_topic_recall: the share of the 60 in the top
topic shown; unanswered_topic_purity: the share of that topic that are among the 60.

End to end (the wiring, not the statistics): a live service (`rag serve`'s app on loopback,
SQLite, the bundled embedder) holds 100 summaries of each mix; 300 stream texts are asked over
HTTP (`/ask`, extractive), 100 from mix A, then 200 from mix B, with a reference and a window
of 100 and the drift loop every second. It reports how many answers were recorded, the
questions after the shift until `/v1/collections/{id}/quality` shows the alert, and whether
`/metrics` carries it (`rag_drift_alert`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # before bench/: bench/ingest.py is not the package

from _data import shared  # noqa: E402

from rag.config import QualitySettings  # noqa: E402
from rag.db import Database  # noqa: E402
from rag.db import answers as sql  # noqa: E402
from rag.db.answers import Asked, NewAnswer  # noqa: E402
from rag.db.migrate import upgrade  # noqa: E402
from rag.db.models import Collection, Tenant  # noqa: E402
from rag.quality.topics import topics  # noqa: E402
from rag.quality.watch import Watch, _document_means  # noqa: E402

MIX_A = ["People", "Geography", "Arts", "History", "Technology", "Everyday life", "company"]
MIX_B = [
    "Biology and health sciences", "Physical sciences", "Society and social sciences",
    "Philosophy and religion", "Mathematics", "Uncategorized",
]  # fmt: skip


def pools(per_topic: int, seed: int = 0) -> tuple[dict[str, list[str]], list[str]]:
    """topic -> texts, and the summaries' first sentences by topic for content drift."""
    rng = np.random.default_rng(seed)
    rows = [json.loads(line) for line in shared("wiki_vital", "passages.jsonl").open()]
    topic_of = {r["_id"]: r["topic"] for r in rows}
    out: dict[str, list[str]] = {t: [] for t in MIX_A + MIX_B}
    for line in (HERE / "qa" / "wiki_factual.jsonl").open():
        q = json.loads(line)
        t = topic_of.get(q.get("gold") or "")
        if t in out:
            out[t].append(q["question"])
    out["company"] += [
        json.loads(line)["question"] for line in (HERE / "qa" / "company_factual.jsonl").open()
    ]
    by_topic: dict[str, list[str]] = {}
    for r in rows:
        by_topic.setdefault(r["topic"], []).append(r["text"].split(". ")[0][:300])
    for t, texts in by_topic.items():
        if t in out:
            picked = rng.choice(len(texts), size=min(per_topic, len(texts)), replace=False)
            out[t] += [texts[i] for i in picked]
    return out, []


def stream(
    pool_vecs: dict[str, np.ndarray], weights: np.ndarray, n: int, rng: np.random.Generator
) -> np.ndarray:
    names = list(pool_vecs)
    topic = rng.choice(len(names), size=n, p=weights)
    return np.vstack([pool_vecs[names[t]][rng.integers(len(pool_vecs[names[t]]))] for t in topic])


def mix(names: list[str], chosen: list[str]) -> np.ndarray:
    w = np.array([1.0 if n in chosen else 0.0 for n in names])
    return w / w.sum()


def run_stream(
    vectors: np.ndarray, settings: QualitySettings, folder: Path, label: str
) -> list[int]:
    """Record each question as the writer does; test every `check_every`; the question
    indexes at which an alert began."""
    db = Database(f"sqlite:///{folder / (label + '.db')}")
    upgrade(db)
    with db.write() as s:
        s.add(Tenant(id="t", name="bench"))
        s.flush()
        s.add(Collection(id="c", tenant_id="t", name="c", embedding_model="minilm",
                         embedding_dim=384, chunk_tokens=200, chunk_overlap=32))  # fmt: skip
    watch = Watch(db, settings)
    every = settings.drift.advanced.check_every
    onsets, alerting = [], False
    t0 = time.time() - len(vectors)
    for start in range(0, len(vectors), every):
        rows = [
            NewAnswer(
                id=f"a{start + i:07d}",
                tenant_id="t",
                collection_id="c",
                created_at=t0 + start + i,
                question=None,
                question_embedding=v.astype("<f4").tobytes(),
                answer="",
                chunk_ids=[],
                document_ids=[],
                settings={},
                answer_source="quoted",
                finish_reason="stop",
                mode="generate",
                top_score=None,
                score_gap=None,
                unsupported=0,
                first_token_ms=None,
                latency_ms=0.0,
                weak=False,
            )  # fmt: skip
            for i, v in enumerate(vectors[start : start + every])
        ]
        with db.write() as s:
            sql.insert(s, rows)
        checked = watch.check_questions("c", "t")
        if checked.tested and checked.alert and not alerting:
            onsets.append(start + len(rows))
        if checked.tested:
            alerting = checked.alert
    db.dispose()
    return onsets


def end_to_end(texts: dict[str, list[str]], rng: np.random.Generator) -> dict[str, object]:
    """300 questions through /ask on a live service; what the service recorded and showed."""
    import httpx

    from rag.api.app import create_app
    from rag.api.loopback import LiveServer
    from rag.auth import create_key
    from rag.config import Settings
    from rag.services import build_services

    rows = [json.loads(line) for line in shared("wiki_vital", "passages.jsonl").open()]
    docs = [r["text"] for t in (MIX_A, MIX_B) for r in
            [r for r in rows if r["topic"] in t][:100]]  # fmt: skip

    def draw(chosen: list[str], count: int) -> list[str]:
        names = [t for t in chosen if texts.get(t)]
        return [
            texts[names[t]][rng.integers(len(texts[names[t]]))]
            for t in rng.integers(len(names), size=count)
        ]

    questions = draw(MIX_A, 100) + draw(MIX_B, 200)
    admin = "bench-admin-key-0123456789"
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            auth={"admin_key": admin},
            engine={"load_at_start": False},
            quality={"interval_s": 1.0,
                     "drift": {"reference_size": 100, "window": 100,
                               "advanced": {"check_every": 50}}},
        )  # fmt: skip
        services = build_services(settings, announce_admin_key=False)
        key, _ = create_key(services.db, "bench")
        headers = {"Authorization": f"Bearer {key}"}
        with LiveServer(create_app(settings, services)) as server:
            c = httpx.Client(base_url=server.url, headers=headers, timeout=120)
            cid = c.post("/v1/collections", json={"name": "mixed"}).json()["id"]
            for text in docs:
                c.post(f"/v1/collections/{cid}/documents", json={"text": text})
            while c.get(f"/v1/collections/{cid}").json()["documents"].get("indexed", 0) < len(docs):
                time.sleep(0.5)
            onset, ok, alert_seen = None, 0, False
            for i, q in enumerate(questions, 1):
                r = c.post(f"/v1/collections/{cid}/ask", json={"question": q, "mode": "extractive"})
                ok += r.status_code == 200 and bool(r.json().get("answer_id"))
                if i % 50 == 0:
                    time.sleep(2.5)  # the writer's flush and one turn of the drift loop
                    drift = c.get(f"/v1/collections/{cid}/quality").json()["drift"]
                    alert = any(d["kind"] == "questions" and d["alert"] for d in drift)
                    if alert and onset is None and i > 100:
                        onset = i - 100
                    alert_seen = alert_seen or (alert and i <= 100)
            assert services.quality is not None
            services.quality.recorder.flush()
            recorded = services.quality.recorder.written
            metrics = c.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
            c.close()
    in_metrics = any(
        line.startswith("rag_drift_alert") and 'kind="questions"' in line and cid in line
        and line.rstrip().endswith("1.0")
        for line in metrics.splitlines()
    )  # fmt: skip
    return {
        "asked": len(questions), "answered_with_id": ok, "recorded": recorded, "delay": onset,
        "alert_before_shift": alert_seen, "alert_in_metrics": in_metrics,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 2000 if args.quick else 5000
    ramp = 1000 if args.quick else 2000
    rng = np.random.default_rng(7)
    from rag.embed import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(device="cpu")
    texts, _ = pools(per_topic=80 if args.quick else 200)
    t = time.perf_counter()
    vecs = {k: embedder.embed(v) for k, v in texts.items() if v}
    took = time.perf_counter() - t
    print(f"embedded {sum(len(v) for v in texts.values())} texts in {took:.0f} s", file=sys.stderr)
    names = list(vecs)
    a, b = mix(names, MIX_A), mix(names, MIX_B)
    settings = QualitySettings()
    cfg = settings.drift
    test = cfg.advanced
    print(f"settings: reference {cfg.reference_size}, window {cfg.window}, every "
          f"{test.check_every}, permutations {test.permutations}, alpha {test.alpha}, "
          f"consecutive {test.consecutive}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stationary = stream(vecs, a, n, rng)
        false_alarms = run_stream(stationary, settings, folder, "stationary")
        half = n // 2
        shifted = np.vstack([stream(vecs, a, half, rng), stream(vecs, b, n - half, rng)])
        onsets = [o for o in run_stream(shifted, settings, folder, "shift") if o > half]
        delay = onsets[0] - half if onsets else float("nan")
        start = n - ramp - 200 if n - ramp - 200 > 400 else 400
        parts = [stream(vecs, a, start, rng)]
        for i in range(ramp + 200):
            w = min(1.0, i / ramp)
            parts.append(stream(vecs, (1 - w) * a + w * b, 1, rng))
        gradual = np.vstack(parts)[:n]
        g_onsets = [o for o in run_stream(gradual, settings, folder, "gradual") if o > start]
        g_delay = g_onsets[0] - start if g_onsets else float("nan")

    # Content drift: document vectors, as the watch compares them.
    wiki = [k for k in names if k != "company"]
    wiki_vecs = {k: vecs[k] for k in wiki}

    def documents(chosen: list[str], count: int) -> dict[str, list[bytes]]:
        drawn = stream(wiki_vecs, mix(wiki, chosen), count, rng)
        return {f"d{i}": [v.astype("<f4").tobytes()] for i, v in enumerate(drawn)}

    ref_docs, same, other = documents(MIX_A, 200), documents(MIX_A, 30), documents(MIX_B, 30)
    from rag.quality.drift import mmd_test

    def content(new: dict[str, list[bytes]]) -> bool:
        test = mmd_test(
            _document_means(ref_docs), _document_means(new),
            permutations=cfg.advanced.permutations, alpha=cfg.advanced.alpha, seed=1,
        )  # fmt: skip
        return test.exceeded

    content_ok = content(other) and not content(same)

    # Unanswered topics.
    faq = [json.loads(line)["text"] for line in shared("docfaq", "queries.jsonl").open()]
    uncovered = embedder.embed(faq[:60])
    others = stream(vecs, a, 2000, rng)
    collection = np.vstack([vecs[k] for k in names if k in MIX_A])
    asked = np.vstack([others, uncovered])
    top = (asked @ collection.T).max(axis=1)
    # The question's own text is in the pool the collection is made of: leave it out.
    top[:2000] = np.sort(asked[:2000] @ collection.T, axis=1)[:, -2]
    weak = np.flatnonzero(top < settings.advanced.weak_score)
    rows = [Asked(f"q{i}", float(i), asked[i].astype("<f4").tobytes(), float(top[i]), True)
            for i in weak]  # fmt: skip
    found = topics(
        rows, {}, distance=settings.advanced.topic_distance, weak_score=settings.advanced.weak_score
    )
    members = {int(m[1:]) for m in found[0].members} if found else set()
    target = set(range(2000, 2060))
    recall = len(members & target) / 60
    purity = len(members & target) / max(1, len(members))

    target = set(range(2000, 2060))
    for rank, found_topic in enumerate(found[:10], 1):
        got = {int(m[1:]) for m in found_topic.members}
        hit = len(got & target)
        if hit >= 30:
            print(f"the uncovered subject's topic: number {rank} shown, recall {hit / 60:.3f}, "
                  f"purity {hit / len(got):.3f}")  # fmt: skip
            break
    print(f"weak questions clustered: {len(weak)} of 2060; topics: "
          f"{[t.count for t in found[:5]]}")  # fmt: skip
    wired = end_to_end(texts, rng)
    print(f"end to end over /ask: {wired['asked']} asked, {wired['answered_with_id']} answered "
          f"with an id, {wired['recorded']} recorded; alert {wired['delay']} questions after the "
          f"shift (reference and window 100); alert before it: {wired['alert_before_shift']}; "
          f"rag_drift_alert 1 in /metrics: {wired['alert_in_metrics']}")  # fmt: skip
    print(f"FIGURE drift_detect_delay {delay}")
    print(f"FIGURE drift_false_alarms {len(false_alarms)}")
    print(f"FIGURE gradual_detect_delay {g_delay}")
    print(f"FIGURE content_drift_detected {int(content_ok)}")
    print(f"FIGURE unanswered_topic_recall {recall:.3f}")
    print(f"FIGURE unanswered_topic_purity {purity:.3f}")


if __name__ == "__main__":
    main()
