"""The local engine's front end: asyncio streams in, one step loop in its own thread.

submit() validates and tokenizes in the caller's thread, then hands the sequence to the step
loop, which runs schedule -> forward -> postprocess and sends token events back to each
request's asyncio queue. Nothing here imports torch: the runner does (rag.engine.build).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from rag.engine.blocks import BlockManager
from rag.engine.passages import PassageKVCache, PassageStats
from rag.engine.protocol import EngineMetrics, Prompt, Runner, SegmentedPrompt, Tokenizer
from rag.engine.scheduler import Scheduler, SchedulerConfig
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    FinishReason,
    InvalidRequest,
    SamplingParams,
    Sequence,
    TokenEvent,
    Usage,
)
from rag.engine.step import ModelRunnerOutput, SchedulerOutput
from rag.engine.stream import Pending, RequestStream, deliver
from rag.torch_threads import team_thread

logger = logging.getLogger(__name__)


class Engine:
    """Continuous-batching generator over a paged KV cache."""

    def __init__(
        self,
        runner: Runner,
        tokenizer: Tokenizer,
        scheduler_config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_ids: tuple[int, ...] = (),
        max_waiting: int = 256,
        passages: PassageKVCache | None = None,
        threads: int | None = None,
        init_threads: Callable[[], object] | None = None,
    ):
        self.runner = runner
        # The step thread's torch team (rag.torch_threads.team_thread); None: the process-wide
        # default. `init_threads`: the compiled kernels' own sizing of it.
        self.threads = threads
        self._init_threads = init_threads
        self.tokenizer = tokenizer
        self.config = scheduler_config
        self.max_model_len = scheduler_config.max_model_len
        self.block_manager = block_manager
        # The passage KV cache lives with the runner's tensors; the scheduler plans with its
        # index, and deletes reach it through drop_chunks.
        self.passages = passages
        lookup = passages.tokens_of if passages is not None else None
        self.scheduler = Scheduler(scheduler_config, block_manager, lookup)
        self.eos_token_ids = eos_token_ids
        self.max_waiting = max_waiting
        self._cv = threading.Condition()
        self._inbox: deque[Pending] = deque()
        self._aborts: list[str] = []
        # Chunks deleted since the last step, and how many drops the engine thread has done.
        self._drops: set[int] = set()
        self._drops_asked = self._drops_done = 0
        self._requests: dict[str, Pending] = {}
        self._waiting_snapshot = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._generated = 0

    # ----- public API (GenerationBackend)
    @property
    def context_tokens(self) -> int:
        return self.max_model_len

    def count_tokens(self, prompt: Prompt) -> int:
        return len(self.tokenizer.encode_prompt(prompt))

    def has_room(self) -> bool:
        return self.metrics().waiting < self.max_waiting

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        cache_salt: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Queue a request; iterate the result for its events on `loop` (default: the running
        one; pass it to submit from a worker thread, so tokenizing a long prompt does not
        hold the event loop).

        Raises InvalidRequest (bad parameters, prompt too long) or EngineOverloaded (queue
        full) before any work is done.
        """
        params = params or SamplingParams()
        params.validate(self.max_model_len)
        if isinstance(prompt, str) and not prompt:
            raise InvalidRequest("empty prompt")
        token_ids, spans = self.tokenizer.encode_segments(prompt)
        if not token_ids:
            raise InvalidRequest("prompt has no tokens")
        if len(token_ids) >= self.max_model_len:
            raise InvalidRequest(
                f"prompt has {len(token_ids)} tokens; the context holds {self.max_model_len}"
            )
        loop = loop or asyncio.get_running_loop()
        request_id = request_id or uuid.uuid4().hex
        seq = Sequence(
            request_id, token_ids, params, self.max_model_len, self.eos_token_ids,
            cache_salt=cache_salt, segments=spans,
            kv_reuse=prompt.kv_reuse if isinstance(prompt, SegmentedPrompt) else "prefix",
        )  # fmt: skip
        if seq.kv_reuse == "off":
            seq.cache_salt = f"{cache_salt}|{uuid.uuid4().hex}"  # no prefix shared either
        stream = RequestStream(request_id, self.cancel)
        with self._cv:
            if self._stopping:
                raise EngineError("engine is closed")
            if request_id in self._requests:
                raise InvalidRequest(f"duplicate request id {request_id!r}")
            if len(self._inbox) + self._waiting_snapshot >= self.max_waiting:
                raise EngineOverloaded(f"{self.max_waiting} requests already waiting")
            req = Pending(seq, stream, loop)
            req.prefix_offset = req.read_offset = 0
            self._requests[request_id] = req
            self._inbox.append(req)
            self._ensure_thread()
            self._cv.notify_all()
        return stream

    def cancel(self, request_id: str) -> None:
        """Stop a request; its blocks are freed at the next step boundary (milliseconds)."""
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify_all()

    def metrics(self) -> EngineMetrics:
        s, bm = self.scheduler, self.block_manager
        return EngineMetrics(
            running=len(s.running),
            waiting=len(s.waiting) + len(self._inbox),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_free=bm.num_free_blocks,
            kv_blocks_total=bm.num_blocks,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            preemptions=s.num_preemptions,
            steps=s.num_steps,
            tokens_per_step=s.num_scheduled_tokens / s.num_steps if s.num_steps else 0.0,
            generated_tokens=self._generated,
            draft_tokens=s.num_drafted,
            accepted_tokens=s.num_accepted,
            passages=self._passage_stats(),
        )

    def _passage_stats(self) -> PassageStats:
        reuse = self.scheduler.reuse
        if self.passages is None or reuse is None:
            return PassageStats()
        stats = self.passages.stats
        return PassageStats(
            hits=reuse.num_hits, misses=reuse.num_misses, evictions=stats.evictions,
            stored=stats.stored, reused_tokens=stats.reused_tokens,
            recomputed_tokens=reuse.num_recomputed_tokens, entries=len(self.passages),
            bytes=self.passages.used_bytes, capacity_bytes=self.passages.capacity_bytes,
            token_bytes=stats.token_bytes,
        )  # fmt: skip

    def drop_chunks(self, chunk_ids: set[int], timeout_s: float = 30.0) -> None:
        """Forget whatever is cached from these chunks (their documents were deleted): their
        passage KV entries, the prefix-cache blocks holding their text, and what prompts in
        flight would store of them. Done by the engine thread between two steps (the caches
        are its own); returns once done, or after `timeout_s`."""
        if not chunk_ids:
            return
        with self._cv:
            if self._stopping:
                return
            self._drops |= set(chunk_ids)
            self._drops_asked += 1
            asked = self._drops_asked
            self._ensure_thread()
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._drops_done >= asked or self._stopping, timeout_s)

    def _apply_drops(self, chunk_ids: set[int]) -> None:
        if self.passages is not None:
            self.passages.drop_chunks(chunk_ids)
        blocks = self.block_manager.drop_chunks(chunk_ids)
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            dropped = [s for s in seq.segments if s.chunk_id in chunk_ids]
            if not dropped:
                continue
            # Not cached as a prefix from the first deleted passage on, and not stored.
            first = min(s.start for s in dropped)
            seq.cache_until = first if seq.cache_until is None else min(seq.cache_until, first)
            if seq.plan is not None:
                seq.plan.stores = tuple(st for st in seq.plan.stores if st[3] not in chunk_ids)
        if blocks:
            logger.info("prefix cache: dropped %d blocks of deleted chunks", blocks)

    def step_alive(self) -> bool:
        """True unless the step thread was started and has ended without being stopped."""
        thread = self._thread
        return thread is None or thread.is_alive() or self._stopping

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # ----- step loop (its own thread)
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = team_thread(self._run, self.threads, "engine-step", self._init_threads)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._inbox or self._aborts or self._drops or self.scheduler.has_work):
                    if self._stopping:
                        break
                    self._cv.wait()
                if self._stopping:
                    break
                new = list(self._inbox)
                self._inbox.clear()
                # Still queued as far as admission is concerned until the step below has
                # scheduled them; without this, submit() briefly saw neither the inbox nor
                # them in the waiting count and admitted past max_waiting.
                self._waiting_snapshot += len(new)
                aborts, self._aborts = self._aborts, []
                drops, self._drops = self._drops, set()
                drops_asked = self._drops_asked
            if drops:
                try:
                    self._apply_drops(drops)
                except Exception:
                    logger.exception("could not drop the cached KV of deleted chunks")
                with self._cv:
                    self._drops_done = drops_asked
                    self._cv.notify_all()
            outbox: list[tuple[Pending, Any]] = []
            for req in new:
                try:
                    self.scheduler.add(req.seq)
                except ValueError as exc:  # cannot fit the KV cache at all
                    self._requests.pop(req.seq.request_id, None)
                    outbox.append((req, InvalidRequest(str(exc))))
            for request_id in aborts:
                aborted = self._requests.get(request_id)
                if aborted is not None and self.scheduler.abort(request_id):
                    outbox.append((aborted, self._final(aborted, FinishReason.CANCELLED)))
            if self.scheduler.has_work:
                try:
                    outbox += self._step()
                except Exception as exc:  # a bug or OOM: fail everyone, keep the loop alive
                    logger.exception("engine step failed")
                    outbox += self._fail_all(exc)
            with self._cv:
                self._waiting_snapshot = len(self.scheduler.waiting)
            deliver(outbox)
        deliver(self._fail_all(EngineError("engine closed")))

    def _step(self) -> list[tuple[Pending, Any]]:
        out = self.scheduler.schedule()
        if out.is_empty:
            time.sleep(0.001)  # nothing fits right now; should not happen with sane sizes
            return []
        outbox: list[tuple[Pending, Any]] = []
        started = time.perf_counter()
        try:
            result = self.runner.execute(out)
        except Exception as exc:
            logger.warning(
                "engine step failed (%s); running its requests apart", type(exc).__name__
            )
            result, failed = self._execute_apart(out)
            for request_id, error in failed.items():
                outbox += self._fail_one(request_id, error)
        else:
            self.scheduler.costs.observe(
                out.num_decode_rows,
                out.num_prefill_tokens,
                (time.perf_counter() - started) * 1000,
                out.prefill_position,
            )
        for r in self.scheduler.postprocess(out, result):
            req = self._requests[r.seq.request_id]
            self._generated += len(r.new_token_ids)
            try:
                ev = self._on_token(req, r.new_token_ids, r.finish_reason)
            except Exception as exc:  # this request's text or stops: fail it alone
                logger.exception("request %s failed after its step", r.seq.request_id)
                outbox += self._fail_one(r.seq.request_id, exc)
                continue
            if ev is not None:
                outbox.append((req, ev))
        return outbox

    def _execute_apart(
        self, out: SchedulerOutput
    ) -> tuple[ModelRunnerOutput, dict[str, BaseException]]:
        """A step that failed, again one sequence at a time: what one request brings (a seed
        the sampler refuses, say) fails that request alone. Re-running a chunk rewrites the
        same KV, so the others lose nothing. A failure of every one is the engine's own."""
        sampled: dict[str, int] = {}
        accepted: dict[str, list[int]] = {}
        failed: dict[str, BaseException] = {}
        for chunk in out.chunks:
            try:
                alone = self.runner.execute(SchedulerOutput(chunks=[chunk]))
            except Exception as exc:
                failed[chunk.request_id] = exc
                continue
            sampled.update(alone.sampled)
            accepted.update(alone.accepted)
        if out.chunks and len(failed) == len(out.chunks):
            raise next(iter(failed.values()))
        return ModelRunnerOutput(sampled=sampled, accepted=accepted), failed

    def _fail_one(self, request_id: str, exc: BaseException) -> list[tuple[Pending, Any]]:
        req = self._requests.pop(request_id, None)
        self.scheduler.abort(request_id, FinishReason.ERROR)
        if req is None:
            return []
        logger.warning("request %s failed: %s", request_id, type(exc).__name__)
        return [(req, EngineError(f"generation failed: {type(exc).__name__}"))]

    def _on_token(
        self, req: Pending, token_ids: list[int], reason: FinishReason | None
    ) -> TokenEvent | None:
        seq = req.seq
        ids = seq.output_token_ids
        req.pending_ids.extend(token_ids)
        # Incremental detokenization that waits out incomplete UTF-8 sequences.
        prefix = self.tokenizer.decode(ids[req.prefix_offset : req.read_offset])
        full = self.tokenizer.decode(ids[req.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            req.text += full[len(prefix) :]
            req.prefix_offset, req.read_offset = req.read_offset, len(ids)
        stops = seq.params.stop
        if stops and reason is None:
            hit = min((i for i in (req.text.find(s) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                req.text = req.text[:hit]
                reason = FinishReason.STOP
                self.scheduler.finish(seq, reason)
        if reason is not None:
            return self._final(req, reason)
        hold = max((len(s) for s in stops), default=1) - 1  # could be the start of a stop
        end = max(req.sent, len(req.text) - hold)
        if end == req.sent:
            return None
        ev = TokenEvent(seq.request_id, req.text[req.sent : end], tuple(req.pending_ids))
        req.sent = end
        req.pending_ids = []
        return ev

    def _final(self, req: Pending, reason: FinishReason) -> TokenEvent:
        seq = req.seq
        self._requests.pop(seq.request_id, None)
        queue_ms = prefill_ms = None
        if seq.first_scheduled_time is not None:
            queue_ms = round((seq.first_scheduled_time - seq.arrival_time) * 1000.0, 3)
            if seq.first_token_time is not None:
                prefill_ms = round((seq.first_token_time - seq.first_scheduled_time) * 1000.0, 3)
        usage = Usage(
            seq.num_prompt_tokens, seq.num_cached_tokens, seq.num_output_tokens,
            queue_ms, prefill_ms, seq.num_reused_tokens, seq.num_recomputed_tokens,
        )  # fmt: skip
        ev = TokenEvent(seq.request_id, req.text[req.sent :], tuple(req.pending_ids), reason, usage)
        req.sent = len(req.text)
        req.pending_ids = []
        return ev

    def _fail_all(self, exc: BaseException) -> list[tuple[Pending, Any]]:
        outbox: list[tuple[Pending, Any]] = []
        for request_id, req in list(self._requests.items()):
            self.scheduler.abort(request_id, FinishReason.ERROR)
            outbox.append((req, EngineError(f"generation failed: {exc}")))
        self._requests.clear()
        return outbox
