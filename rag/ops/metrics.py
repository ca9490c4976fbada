"""Prometheus metrics, in a registry of each app's own (tests build many apps in one process).

Two kinds:
- observed in the request path: latency per route template and per stage, status counts
  (the API middleware and `observe_stages`);
- observed as each answer completes (`observe_answer`, `observe_feedback`): quality signals
  per collection (how answers ended, unsupported sentences, top score and gap, latency,
  ratings);
- read at scrape time by `ServiceCollector`: ingest queue and job outcomes from SQL, chunks
  indexed per collection, drift score and alert per collection (from SQL), answer records
  written and dropped, the generator's scheduler and KV-cache figures (only once it is
  loaded: a scrape never builds the engine).

`observe_stages(prefix, timings_ms)` is what a route calls with the `timings_ms` its result
carries; it reaches the current request's `Metrics` through a contextvar the middleware sets,
and does nothing when metrics are off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rag.db import collections, drift, jobs

if TYPE_CHECKING:
    from rag.db.answers import NewAnswer
    from rag.services import Services

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGES = frozenset(
    {
        # search
        "embed", "search", "keyword", "fuse", "hydrate", "rerank",
        # ask: retrieval (reported as "retrieve.<stage>"), then the generator
        "prompt", "queue", "prefill", "first_token", "decode", "generate", "cite",
    }
)  # fmt: skip
# Seconds. Fine at the bottom: a stage such as fuse takes microseconds.
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Cosine scores of the top passage, and its gap to the next.
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
GAP_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)

_current: ContextVar[Metrics | None] = ContextVar("rag_metrics", default=None)


class Metrics:
    """The instruments of one app."""

    def __init__(self, services: Callable[[], Services | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_seconds = Histogram(
            "rag_http_request_duration_seconds",
            "Request latency by route template",
            ["method", "route"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "rag_http_responses",
            "Responses by route template and status code",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "rag_stage_duration_seconds",
            "Time of each stage of a search or an answer",
            ["op", "stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        # Quality signals per collection (rag.quality), observed as each answer completes.
        self.answers = Counter(
            "rag_answers",
            "Answers by how they ended (answer_source, finish_reason)",
            ["collection", "answer_source", "finish_reason"],
            registry=self.registry,
        )
        self.unsupported = Counter(
            "rag_answer_unsupported_sentences",
            "Sentences of answers that no given passage supports",
            ["collection"],
            registry=self.registry,
        )
        self.weak = Counter(
            "rag_answers_weak",
            "Answers refused or given from a top passage below quality.advanced.weak_score",
            ["collection"],
            registry=self.registry,
        )
        self.top_score = Histogram(
            "rag_answer_top_score",
            "The top retrieved passage's dense score",
            ["collection"],
            buckets=SCORE_BUCKETS,
            registry=self.registry,
        )
        self.score_gap = Histogram(
            "rag_answer_score_gap",
            "The top passage's score minus the second's",
            ["collection"],
            buckets=GAP_BUCKETS,
            registry=self.registry,
        )
        self.answer_seconds = Histogram(
            "rag_answer_latency_seconds",
            "Time to the first token and to the whole answer, per collection",
            ["collection", "stage"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.feedback = Counter(
            "rag_feedback",
            "Ratings given to answers (a replaced rating counts again)",
            ["collection", "rating"],
            registry=self.registry,
        )
        self.registry.register(ServiceCollector(services))
        # Labelled children, cached: `.labels()` costs more than an observation.
        self._request_children: dict[tuple[str, str], Histogram] = {}
        self._response_children: dict[tuple[str, str, int], Counter] = {}
        self._stage_children: dict[tuple[str, str], Histogram] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route)
        hist = self._request_children.get(key)
        if hist is None:
            hist = self._request_children[key] = self.request_seconds.labels(method, route)
        hist.observe(seconds)
        rkey = (method, route, status)
        counter = self._response_children.get(rkey)
        if counter is None:
            counter = self.responses.labels(method, route, str(status))
            self._response_children[rkey] = counter
        counter.inc()

    def observe_stages(self, prefix: str, timings_ms: Mapping[str, float]) -> None:
        timings = dict(timings_ms)
        if "decode" not in timings and "generate" in timings and "first_token" in timings:
            # The ask path reports submit→first token and submit→last token.
            timings["decode"] = max(0.0, timings["generate"] - timings["first_token"])
        for name, ms in timings.items():
            stage = name.rpartition(".")[2]  # "retrieve.embed" -> "embed"
            if stage not in STAGES:
                continue  # "total" and anything unknown: the request histogram has those
            key = (prefix, stage)
            hist = self._stage_children.get(key)
            if hist is None:
                hist = self._stage_children[key] = self.stage_seconds.labels(prefix, stage)
            hist.observe(ms / 1000.0)

    def observe_answer(self, row: NewAnswer) -> None:
        c = row.collection_id
        self.answers.labels(c, row.answer_source, row.finish_reason).inc()
        if row.unsupported:
            self.unsupported.labels(c).inc(row.unsupported)
        if row.weak:
            self.weak.labels(c).inc()
        if row.top_score is not None:
            self.top_score.labels(c).observe(row.top_score)
        if row.score_gap is not None:
            self.score_gap.labels(c).observe(row.score_gap)
        if row.first_token_ms is not None:
            self.answer_seconds.labels(c, "first_token").observe(row.first_token_ms / 1000.0)
        self.answer_seconds.labels(c, "answer").observe(row.latency_ms / 1000.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def activate(self) -> object:
        """Make this the current request's metrics; returns a token for `deactivate`."""
        return _current.set(self)

    @staticmethod
    def deactivate(token: object) -> None:
        _current.reset(token)  # type: ignore[arg-type]


def observe_stages(prefix: str, timings_ms: Mapping[str, float]) -> None:
    """Record per-stage timings (milliseconds, as results report them) under `prefix`
    ("search", "ask", ...). A no-op outside a request or with metrics off."""
    metrics = _current.get()
    if metrics is not None:
        metrics.observe_stages(prefix, timings_ms)


def observe_answer(row: NewAnswer) -> None:
    """Count a recorded answer's quality signals under its collection. A no-op outside a
    request or with metrics off."""
    metrics = _current.get()
    if metrics is not None:
        metrics.observe_answer(row)


def observe_feedback(collection_id: str, rating: str) -> None:
    metrics = _current.get()
    if metrics is not None:
        metrics.feedback.labels(collection_id, rating).inc()


class ServiceCollector(Collector):
    """The figures that are cheaper to read when scraped than to keep up to date."""

    def __init__(self, services: Callable[[], Services | None]) -> None:
        self._services = services

    def describe(self) -> list[Metric]:
        return []  # no fixed set: the collector is queried at scrape time only

    def collect(self) -> Iterator[Metric]:
        services = self._services()
        if services is None:
            return
        try:
            yield from _ingest_metrics(services)
            yield from _chunk_metrics(services)
            yield from _drift_metrics(services)
        except Exception:  # a scrape must not fail because the database blinked
            log.warning("could not read ingest metrics from the database", exc_info=True)
            yield GaugeMetricFamily("rag_metrics_database_up", "SQL reachable at scrape", 0)
        else:
            yield GaugeMetricFamily("rag_metrics_database_up", "SQL reachable at scrape", 1)
        yield _index_metrics(services)
        yield from _recorder_metrics(services)
        if services.engine_loaded:
            yield from _engine_metrics(services)


def _ingest_metrics(services: Services) -> Iterator[Metric]:
    by_state = jobs.queue_depth(services.db)
    yield GaugeMetricFamily(
        "rag_ingest_queue_depth",
        "Ingest jobs waiting or running",
        by_state.get("queued", 0) + by_state.get("running", 0),
    )
    family = GaugeMetricFamily(
        "rag_ingest_jobs", "Ingest jobs by state (outcomes)", labels=["state"]
    )
    for state in ("queued", "running", "done", "failed", "cancelled"):
        family.add_metric([state], by_state.get(state, 0))
    for state, n in by_state.items():
        if state not in ("queued", "running", "done", "failed", "cancelled"):
            family.add_metric([state], n)
    yield family


def _chunk_metrics(services: Services) -> Iterator[Metric]:
    with services.db.read() as session:
        rows = collections.indexed_chunks_by_collection(session)
    family = GaugeMetricFamily(
        "rag_chunks_indexed", "Chunks of live, indexed documents", labels=["collection"]
    )
    for collection_id, n in rows.items():
        family.add_metric([collection_id], n)
    yield family


def _drift_metrics(services: Services) -> Iterator[Metric]:
    """Drift as the last test left it in SQL: the same on every replica."""
    with services.db.read() as session:
        rows = drift.states(session)
    score = GaugeMetricFamily(
        "rag_drift_score",
        "Last drift statistic over its permutation threshold (past 1: past the threshold)",
        labels=["collection", "kind"],
    )
    alert = GaugeMetricFamily(
        "rag_drift_alert",
        "1 while a collection's questions (or newest documents) have drifted",
        labels=["collection", "kind"],
    )
    refusals = GaugeMetricFamily(
        "rag_drift_refusal_rate",
        "Share of refused questions in the reference and the recent window",
        labels=["collection", "window"],
    )
    for row in rows:
        score.add_metric([row.collection_id, row.kind], row.score)
        alert.add_metric([row.collection_id, row.kind], 1.0 if row.alert else 0.0)
        for window in ("reference", "recent"):
            value = (row.details or {}).get(f"refusal_rate_{window}")
            if row.kind == "questions" and value is not None:
                refusals.add_metric([row.collection_id, window], value)
    yield score
    yield alert
    yield refusals


def _recorder_metrics(services: Services) -> Iterator[Metric]:
    if services.quality is None:
        return
    rec = services.quality.recorder
    yield CounterMetricFamily(
        "rag_quality_records_dropped",
        "Answer records lost (queue full, or a failed write); the answers were given",
        rec.dropped,
    )
    yield CounterMetricFamily("rag_quality_records_written", "Answer records written", rec.written)


def _index_metrics(services: Services) -> Metric:
    family = GaugeMetricFamily(
        "rag_index_mismatch",
        "Ids an open index missed or held beyond SQL at its last check (repaired since)",
        labels=["collection", "kind"],
    )
    for collection_id, live in services.indexes.lives():
        if live.mismatch is not None:
            family.add_metric([collection_id, live.index.kind], live.mismatch)
    return family


def _engine_metrics(services: Services) -> Iterator[Metric]:
    try:
        m = services.engine.metrics()
    except Exception:
        log.warning("could not read the engine's metrics", exc_info=True)
        return
    seqs = GaugeMetricFamily(
        "rag_engine_sequences", "Sequences by scheduler state", labels=["state"]
    )
    seqs.add_metric(["running"], m.running)
    seqs.add_metric(["waiting"], m.waiting)
    yield seqs
    blocks = GaugeMetricFamily("rag_engine_kv_blocks", "Paged KV-cache blocks", labels=["state"])
    blocks.add_metric(["used"], m.kv_blocks_used)
    blocks.add_metric(["free"], m.kv_blocks_free)
    yield blocks
    yield GaugeMetricFamily(
        "rag_engine_prefix_cache_hit_rate",
        "Share of prompt blocks found in the prefix cache",
        m.prefix_cache_hit_rate,
    )
    yield CounterMetricFamily(
        "rag_engine_preemptions", "Sequences preempted (recomputed later)", m.preemptions
    )
    yield CounterMetricFamily("rag_engine_steps", "Scheduler steps run", m.steps)
    yield GaugeMetricFamily(
        "rag_engine_tokens_per_step", "Mean tokens scheduled per step", m.tokens_per_step
    )
    yield CounterMetricFamily("rag_engine_generated_tokens", "Tokens generated", m.generated_tokens)
    yield CounterMetricFamily(
        "rag_engine_spec_draft_tokens", "Speculative draft tokens verified", m.draft_tokens
    )
    yield CounterMetricFamily(
        "rag_engine_spec_accepted_tokens", "Speculative draft tokens accepted", m.accepted_tokens
    )
    p = m.passages
    lookups = CounterMetricFamily(
        "rag_engine_passage_cache_lookups",
        "Passages a prompt looked up in the passage KV cache, by result",
        labels=["result"],
    )
    lookups.add_metric(["hit"], p.hits)
    lookups.add_metric(["miss"], p.misses)
    yield lookups
    yield CounterMetricFamily(
        "rag_engine_passage_cache_evictions", "Passage KV entries evicted (LRU)", p.evictions
    )
    tokens = CounterMetricFamily(
        "rag_engine_passage_tokens",
        "Prompt tokens of reused passages: copied from the cache, or recomputed in place",
        labels=["how"],
    )
    tokens.add_metric(["reused"], p.reused_tokens)
    tokens.add_metric(["recomputed"], p.recomputed_tokens)
    yield tokens
    yield GaugeMetricFamily("rag_engine_passage_cache_entries", "Passages held", p.entries)
    yield GaugeMetricFamily("rag_engine_passage_cache_bytes", "Bytes of passage KV held", p.bytes)
