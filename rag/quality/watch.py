"""The quality loop: drift tests of every collection with new questions or new documents.

Every process runs one (as it runs a purger); each round, every `quality.interval_s`:

- questions: once `drift.advanced.check_every` questions are new since a collection's last test, the
  latest `drift.window` of them (those not in the reference) are tested against its
  reference window (rag.quality.drift.mmd_test). The reference is the collection's first
  `drift.reference_size` questions, copied into drift_windows when there are that many, or
  the window an operator pinned (`pin`). The alert is `drift.advanced.consecutive` tests past the
  threshold running; the score is the last statistic over its threshold.
- content: once `drift.content_min_new` documents were indexed since the last test, their
  vectors (each document's mean chunk vector) against the documents indexed before.

State is read from and written to SQL (rag.db.drift): a result is written only if no
process wrote one for the same answers first, and the permutations are seeded by the
collection and the answers tested, so every replica computes the same.
"""

from __future__ import annotations

import logging
import threading
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rag.background import Thread
from rag.config import QualitySettings
from rag.db import Database
from rag.db import answers as sql
from rag.db import drift as drift_sql
from rag.db.answers import Asked
from rag.quality.drift import Test, mmd_test, rate, scores_shift

log = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Checked:
    collection_id: str
    kind: str
    tested: bool
    test: Test | None = None
    alert: bool = False
    note: str = ""


def micros(t: float) -> int:
    return int(round(t * 1_000_000))


def vectors(rows: list[Asked]) -> F32:
    return np.vstack([np.frombuffer(r.embedding, dtype="<f4") for r in rows]).astype(np.float32)


def seed_of(collection_id: str, kind: str, mark: int) -> int:
    return zlib.crc32(f"{collection_id}:{kind}:{mark}".encode())


class Watch:
    def __init__(self, db: Database, settings: QualitySettings) -> None:
        self.db = db
        self.settings = settings
        self._loop = Thread("quality-watch", self._run)
        self._round = threading.Lock()

    # ------------------------------------------------------------------ questions

    def check_questions(self, collection_id: str, tenant_id: str, *, force: bool = False) -> (
        Checked
    ):  # fmt: skip
        cfg = self.settings.drift
        with self.db.read() as session:
            state = drift_sql.state(session, collection_id, "questions")
            mark = state.mark if state is not None else 0
            new = sql.count_after(session, collection_id, mark / 1_000_000)
            if not force and new < cfg.advanced.check_every:
                return Checked(collection_id, "questions", False, note="too few new questions")
            reference = drift_sql.reference(session, collection_id)
            first: list[Asked] = []
            if len(reference) < cfg.reference_size and not (state and state.pinned):
                first = sql.recent(session, collection_id, cfg.reference_size, oldest_first=True)
            held = {r.id for r in (reference or first)}
            recent = [
                r
                for r in sql.recent(session, collection_id, cfg.window + len(held))
                if r.id not in held
            ][: cfg.window]
        newest = max((r.created_at for r in recent), default=mark / 1_000_000)
        if first:
            if len(first) < cfg.reference_size:
                return Checked(collection_id, "questions", False, note="collecting the reference")
            with self.db.write() as session:
                drift_sql.set_reference(session, collection_id, first)
            reference = first
        if len(recent) < cfg.window:
            return Checked(collection_id, "questions", False, note="collecting the window")
        new_mark = micros(newest)
        test = self._test(collection_id, "questions", new_mark, vectors(reference), vectors(recent))
        streak = (state.streak if state is not None else 0) + 1 if test.exceeded else 0
        alert = streak >= cfg.advanced.consecutive
        shift = scores_shift(
            [r.top_score for r in reference if r.top_score is not None],
            [r.top_score for r in recent if r.top_score is not None],
        )
        details = {
            "p_value": test.p_value,
            "reference": test.n_reference,
            "window": test.n_recent,
            "top_score_ks": shift.ks if shift else None,
            "top_score_p": shift.p_value if shift else None,
            "top_score_reference": shift.reference_mean if shift else None,
            "top_score_recent": shift.recent_mean if shift else None,
            "refusal_rate_reference": rate([r.refused for r in reference]),
            "refusal_rate_recent": rate([r.refused for r in recent]),
        }
        with self.db.write() as session:
            saved = drift_sql.save(
                session, collection_id, "questions", tenant_id, expect_mark=mark,
                score=test.score, statistic=test.statistic, threshold=test.threshold,
                alert=alert, streak=streak, mark=new_mark, details=details,
            )  # fmt: skip
        if saved and alert and not (state and state.alert):
            log.warning("question drift in collection %s (score %.2f)", collection_id, test.score)
        return Checked(collection_id, "questions", saved, test, alert)

    def pin(self, collection_id: str, tenant_id: str, rows: list[Asked]) -> int:
        """Make `rows` the collection's reference window (an operator's choice)."""
        with self.db.write() as session:
            drift_sql.set_reference(session, collection_id, rows)
            drift_sql.pin(session, collection_id, tenant_id, True)
        return len(rows)

    # ------------------------------------------------------------------ content

    def check_content(self, collection_id: str, tenant_id: str, newest: float) -> Checked:
        cfg = self.settings.drift
        with self.db.read() as session:
            state = drift_sql.state(session, collection_id, "content")
            mark = state.mark if state is not None else 0
            if micros(newest) <= mark:
                return Checked(collection_id, "content", False, note="nothing new")
            if state is None:
                new: dict[str, list[bytes]] = {}
                old: dict[str, list[bytes]] = {}
            else:
                after = mark / 1_000_000
                new = drift_sql.document_vectors(
                    session, collection_id, after=after, upto=newest, limit=cfg.reference_size
                )
                if len(new) < cfg.content_min_new:
                    return Checked(collection_id, "content", False, note="too few new documents")
                old = drift_sql.document_vectors(
                    session, collection_id, after=None, upto=after, limit=cfg.reference_size
                )
        new_mark = micros(newest)
        if len(old) < 2:  # the first documents: what later uploads are compared with
            with self.db.write() as session:
                drift_sql.save(
                    session, collection_id, "content", tenant_id, expect_mark=mark,
                    mark=new_mark, details={"reference_documents": len(old) + len(new)},
                )  # fmt: skip
            return Checked(collection_id, "content", False, note="the first documents")
        test = self._test(
            collection_id, "content", new_mark, _document_means(old), _document_means(new)
        )
        details = {
            "p_value": test.p_value,
            "reference_documents": test.n_reference,
            "new_documents": test.n_recent,
        }
        with self.db.write() as session:
            saved = drift_sql.save(
                session, collection_id, "content", tenant_id, expect_mark=mark,
                score=test.score, statistic=test.statistic, threshold=test.threshold,
                alert=test.exceeded, streak=int(test.exceeded), mark=new_mark, details=details,
            )  # fmt: skip
        if saved and test.exceeded:
            log.warning("content drift in collection %s (score %.2f)", collection_id, test.score)
        return Checked(collection_id, "content", saved, test, test.exceeded)

    def _test(self, collection_id: str, kind: str, mark: int, reference: F32, recent: F32) -> Test:
        cfg = self.settings.drift
        return mmd_test(
            reference, recent, permutations=cfg.advanced.permutations, alpha=cfg.advanced.alpha,
            seed=seed_of(collection_id, kind, mark),
        )  # fmt: skip

    # ------------------------------------------------------------------ the loop

    def run_once(self) -> list[Checked]:
        with self._round:
            out: list[Checked] = []
            with self.db.read() as session:
                asked = sql.newest(session)
                indexed = drift_sql.indexed_since(session)
            for cid, (_t, tenant) in sorted(asked.items()):
                out.append(self._safely(self.check_questions, cid, tenant))
            for cid, (t, tenant) in sorted(indexed.items()):
                out.append(self._safely(self.check_content, cid, tenant, t))
            return [c for c in out if c is not None]

    def _safely(self, fn: object, *args: object) -> Checked:
        try:
            return fn(*args)  # type: ignore[operator, no-any-return]
        except Exception:
            log.exception("drift check of collection %s failed", args[0])
            return Checked(str(args[0]), "", False, note="failed")

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    def _run(self) -> None:
        while not self._loop.stop.wait(self.settings.interval_s):
            try:
                self.run_once()
            except Exception:
                log.exception(
                    "quality round failed; trying again in %.0f s", self.settings.interval_s
                )


def _document_means(docs: dict[str, list[bytes]]) -> F32:
    rows = []
    for blobs in docs.values():
        v = np.mean([np.frombuffer(b, dtype="<f4") for b in blobs], axis=0)
        n = float(np.linalg.norm(v))
        rows.append(v / n if n > 0 else v)
    return np.vstack(rows).astype(np.float32)
