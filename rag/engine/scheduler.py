"""Continuous batching: which tokens of which sequences go into the next step.

Every step mixes the running sequences' decodes with prefill chunks of new prompts up to a
token budget. When KV blocks run out, the newest running sequence is preempted: its blocks
are freed and it is recomputed later (its tokens are kept, and the prefix cache often brings
most of them back for free). The scheduler talks to the model runner only through the plain
dataclasses below, so its tests build step results by hand.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from rag.engine.blocks import BlockManager
from rag.engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    # Keep this fraction of blocks free when admitting new work, so a fresh admission does not
    # immediately force a preemption on the next decode step.
    watermark: float = 0.01


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one sequence to run this step: token_ids at positions start_pos, ..."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]  # covers start_pos + len(token_ids) tokens
    sample: bool  # the chunk ends the known tokens, so the next token is sampled
    params: SamplingParams


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # since the previous step (runner cleanup)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True)
class ModelRunnerOutput:
    sampled: dict[str, int]  # request_id -> next token, for chunks with sample=True


@dataclass(frozen=True)
class StepResult:
    """What one step did to one sequence (for the front end)."""

    seq: Sequence
    new_token_id: int | None
    finish_reason: FinishReason | None


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_scheduled_tokens = 0

    # ----- requests
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._by_id:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        if self.bm.blocks_needed(seq.num_tokens + 1) > self.bm.num_blocks:
            raise ValueError("sequence can never fit in the KV cache")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._by_id[seq.request_id] = seq

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Finish a request now and free its blocks. False if it is unknown or done."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        self.finish(seq, reason)
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._by_id.pop(seq.request_id, None)
        self._finished_since_step.append(seq.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----- one step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished=self._finished_since_step)
        self._finished_since_step = []
        budget = self.config.max_num_batched_tokens

        # 1. Running sequences first, oldest first: decodes and unfinished prefills.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, out):
                break  # seq preempted itself: nothing after it is left running
            out.chunks.append(self._chunk(seq, num_new))
            budget -= num_new
            i += 1

        # 2. Admit waiting sequences, unless this step had to preempt.
        if not out.preempted:
            watermark = int(self.config.watermark * self.bm.num_blocks)
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                seq = self.waiting[0]
                hits, num_hit_tokens = self.bm.get_computed_blocks(seq)
                num_new = min(seq.num_tokens - num_hit_tokens, budget)
                need = self.bm.blocks_needed(num_hit_tokens + num_new) - len(hits)
                if self.bm.num_free_blocks - need < watermark and self.running:
                    break
                if self.bm.allocate_slots(seq, num_new, hits) is None:
                    break
                self.waiting.popleft()
                self.bm.record_prefix_lookup(seq.num_tokens, num_hit_tokens)
                seq.num_computed_tokens = num_hit_tokens
                if seq.num_preemptions == 0:
                    seq.num_cached_tokens = num_hit_tokens
                seq.status = SequenceStatus.RUNNING
                if seq.first_scheduled_time is None:
                    seq.first_scheduled_time = time.monotonic()
                self.running.append(seq)
                out.chunks.append(self._chunk(seq, num_new))
                budget -= num_new

        self.num_steps += 1
        self.num_scheduled_tokens += out.num_tokens
        return out

    def postprocess(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[StepResult]:
        """Advance the scheduled sequences by the step's results; finish those that are done."""
        results: list[StepResult] = []
        for chunk in out.chunks:
            seq = self._by_id.get(chunk.request_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens += len(chunk.token_ids)
            self.bm.cache_full_blocks(seq)
            if not chunk.sample:
                continue
            token = result.sampled[chunk.request_id]
            if seq.first_token_time is None:
                seq.first_token_time = time.monotonic()
            seq.append_token(token)
            reason = seq.check_stop()
            if reason is not None:
                self.finish(seq, reason)
            results.append(StepResult(seq, token, reason))
        return results

    # ----- internals
    def _chunk(self, seq: Sequence, num_new: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        return ScheduledChunk(
            request_id=seq.request_id,
            token_ids=seq.token_ids[start : start + num_new],
            start_pos=start,
            block_table=list(seq.block_table),
            sample=start + num_new == seq.num_tokens,
            params=seq.params,
        )

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Allocate for seq, preempting the newest running sequences until it fits."""
        while self.bm.allocate_slots(seq, num_new) is None:
            victim = self.running[-1]  # newest; not scheduled yet in this step
            self._preempt(victim)
            out.preempted.append(victim.request_id)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        logger.debug("preempted request %s (recompute)", seq.request_id)
