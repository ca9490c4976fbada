"""Requests as the engine sees them: sampling parameters, sequences, events and errors."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rag.engine.spec import SpecState


class EngineError(Exception):
    """Base class of the engine's errors."""


class InvalidRequest(EngineError, ValueError):
    """Bad parameters or a prompt that cannot fit; refused before any work."""


class EngineOverloaded(EngineError):
    """The waiting queue is full; the caller should retry later (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation knobs. temperature 0 means greedy."""

    max_tokens: int | None = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Over generated tokens only (rag.engine.rules): OpenAI's frequency and presence
    # penalties, and transformers' repetition penalty (1 = off).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # > 0: the answer cites passages 1..cite_passages; a marker "[" may hold nothing else.
    cite_passages: int = 0
    # With cite_passages: the passages a marker may name, given the sentence it closes (the
    # answer path's evidence, rag.answer.cite.chooser; () = any). Not part of equality.
    cite_choice: Callable[[str], tuple[int, ...]] | None = field(default=None, compare=False)
    # End the answer (finish reason "repetition") when its last REPEAT_NGRAM tokens were
    # generated before, in that order: a loop.
    stop_repetition: bool = False

    def __post_init__(self) -> None:
        # Lists are accepted for convenience; keep the dataclass hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """The sampler needs the sequence's tokens (penalties look at what was generated)."""
        return bool(
            self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
            or self.cite_passages
        )

    def validate(self, max_model_len: int | None) -> None:
        """Raise InvalidRequest if these parameters cannot be served (`max_model_len` None:
        the context length is not known here)."""
        if self.max_tokens is not None:
            if self.max_tokens <= 0:
                raise InvalidRequest(f"max_tokens must be > 0, got {self.max_tokens}")
            if max_model_len is not None and self.max_tokens > max_model_len:
                raise InvalidRequest(
                    f"max_tokens {self.max_tokens} exceeds the context length {max_model_len}"
                )
        if not (self.temperature >= 0.0):  # also catches NaN
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequest(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequest(f"{name} must be between -2 and 2, got {value}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequest(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
            )
        if not 0 <= self.cite_passages <= 1000:
            raise InvalidRequest(f"cite_passages must be 0..1000, got {self.cite_passages}")


@dataclass(frozen=True)
class SegmentSpan:
    """Where a reusable segment's tokens lie in an encoded prompt: positions [start, end)."""

    start: int
    end: int
    key: str
    chunk_id: int | None = None


@dataclass
class ReusePlan:
    """How a "blend" prompt is computed: copy the cached passages in, compute `positions`
    (everything else, and each reused passage's first tokens), store the passages computed
    here (rag.engine.passages)."""

    positions: list[int]
    copies: tuple[tuple[str, int, int], ...]  # (key, position, tokens)
    stores: tuple[tuple[str, int, int, int | None], ...]  # (key, position, tokens, chunk id)
    end: int  # the sequence's length when planned: computed up to here once done
    done: int = 0  # positions computed so far
    # Recompute by deviation: which of `positions` are reused passage tokens (computed in the
    # first layer, then only the `ratio` whose values deviate most from the cached ones).
    candidates: list[bool] | None = None
    ratio: float = 0.0

    @property
    def sparse(self) -> bool:
        return bool(self.copies)

    @property
    def left(self) -> int:
        return len(self.positions) - self.done


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context length
    CANCELLED = "cancelled"
    ERROR = "error"
    REPETITION = "repetition"  # the answer began to repeat itself (stop_repetition)


_ids = itertools.count()

# A loop: this many generated tokens, repeated in order (a sentence of ~8 words said twice).
REPEAT_NGRAM = 10


@dataclass(eq=False)
class Sequence:
    """One request's tokens and its place in the KV cache.

    token_ids holds the prompt followed by the generated tokens. num_computed_tokens counts the
    leading tokens whose keys and values are in the cache; the rest are fed in the next steps.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (first admission)
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None  # its prefill began (first admission)
    first_token_time: float | None = None  # its prefill ended: the first token was sampled
    seq_no: int = field(default_factory=lambda: next(_ids))
    spec: SpecState | None = None  # speculative decoding state, when drafting
    _ngrams: set[tuple[int, ...]] | None = None  # stop_repetition: the output's n-grams
    # Prefix-cache blocks are shared only among sequences with the same salt (the tenant),
    # so one tenant cannot probe another's recent prompts through cache hits.
    cache_salt: str | None = None
    # Passage KV reuse (rag.engine.passages): where the prompt's passages lie, the mode, the
    # plan while the prompt is computed, and where its KV stops being exact.
    segments: list[SegmentSpan] = field(default_factory=list)
    kv_reuse: str = "prefix"
    plan: ReusePlan | None = None
    # From this position on the prompt's KV is a blend's, not exact: its blocks are cached
    # as approximate (found only by other blend prompts). None: exact throughout.
    exact_until: int | None = None
    # From this position on nothing is cached at all (a passage deleted while in flight).
    cache_until: int | None = None
    num_reused_tokens: int = 0
    num_recomputed_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def check_stop(self) -> FinishReason | None:
        """Finish reason after the last appended token, if any (stop strings: the engine)."""
        last = self.token_ids[-1]
        if not self.params.ignore_eos and last in self.eos_token_ids:
            return FinishReason.STOP
        if last in self.params.stop_token_ids:
            return FinishReason.STOP
        if self.params.max_tokens is not None and self.num_output_tokens >= self.params.max_tokens:
            return FinishReason.LENGTH
        if self.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        if self.params.stop_repetition and self._repeats():
            return FinishReason.REPETITION
        return None

    def _repeats(self) -> bool:
        """Whether the last REPEAT_NGRAM generated tokens appeared before among the generated
        ones (each appended token's n-gram is remembered)."""
        n = REPEAT_NGRAM
        out = self.num_output_tokens
        if out < n:
            return False
        if self._ngrams is None:
            self._ngrams = set()
        gram = tuple(self.token_ids[-n:])
        if gram in self._ngrams:
            return True
        self._ngrams.add(gram)
        return False


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    # Where the time to first token went: waiting for admission, then prefill (None when the
    # request never got that far, or from a remote engine that does not say).
    queue_ms: float | None = None
    prefill_ms: float | None = None
    # Prompt tokens whose KV came from the passage cache, and those of reused passages that
    # were recomputed in place (the rest: cached_prompt_tokens from the prefix cache, and
    # computed fresh).
    reused_prompt_tokens: int = 0
    recomputed_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenEvent:
    """A piece of a request's stream. The last one has finish_reason and usage set."""

    request_id: str
    text: str  # new text since the previous event
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
