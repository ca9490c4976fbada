"""One step between the scheduler and the model runner, as plain data: the chunks the
scheduler chose (ScheduledChunk in a SchedulerOutput), the tokens the runner sampled
(ModelRunnerOutput), and what the step did to each sequence (StepResult, for the front end).
No torch: the scheduler's tests build these by hand."""

from __future__ import annotations

from dataclasses import dataclass, field

from rag.engine.sequence import FinishReason, SamplingParams, Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one sequence to run this step: token_ids at positions start_pos, ...

    With `num_draft` > 0 the chunk is a decode plus that many draft tokens (the last ones of
    token_ids) to verify: a token is sampled after each of its last num_draft + 1 positions."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]  # covers start_pos + len(token_ids) tokens
    sample: bool  # the chunk ends the known tokens, so the next token is sampled
    params: SamplingParams
    num_draft: int = 0
    # The sequence's tokens so far (prompt and output) when a sampler needs them (penalties,
    # drafts); None otherwise.
    history: list[int] | None = None
    num_prompt: int = 0  # where the output starts in history
    # Passage KV reuse: the positions of token_ids when they are not contiguous (the tokens
    # a prompt computes around its reused passages), the cached passages to copy in before
    # the step (key, position, tokens), and the passages to store after it (key, position,
    # tokens, chunk id).
    positions: list[int] | None = None
    copies: tuple[tuple[str, int, int], ...] = ()
    stores: tuple[tuple[str, int, int, int | None], ...] = ()
    # Recompute by deviation: which tokens are reused passage tokens, and the share of them
    # to carry past the first layer.
    candidates: list[bool] | None = None
    recompute_ratio: float = 0.0

    @property
    def is_decode_row(self) -> bool:
        """Single-token rows: a decode, or a chunk that verifies drafts (all its tokens)."""
        return (len(self.token_ids) == 1 and self.positions is None) or self.num_draft > 0


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # since the previous step (runner cleanup)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_decode_rows(self) -> int:
        """Single-token rows: decodes, and the tokens of chunks that verify drafts."""
        return sum(len(c.token_ids) for c in self.chunks if c.is_decode_row)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_rows

    @property
    def prefill_position(self) -> float | None:
        """The mean position of the prompt tokens in their prompts (None without any)."""
        total, count = 0, 0
        for c in self.chunks:
            if c.is_decode_row:
                continue
            n = len(c.token_ids)
            total += (
                sum(c.positions) if c.positions is not None else n * c.start_pos + n * (n - 1) // 2
            )
            count += n
        return total / count if count else None

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True)
class ModelRunnerOutput:
    sampled: dict[str, int]  # request_id -> next token, for chunks with sample=True
    # request_id -> the draft tokens accepted before that token (chunks with num_draft > 0)
    accepted: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """What one step did to one sequence (for the front end): the tokens it gained (one, or
    several when drafts were accepted) and whether it finished."""

    seq: Sequence
    new_token_ids: list[int]
    finish_reason: FinishReason | None
