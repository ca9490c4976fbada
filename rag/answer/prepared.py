"""What an answer is before and after it is generated: `Prepared` (the passages given, the
deadline, the timings so far; for a generated answer, `Running` adds the submitted generation)
and the `Final` event every answer's stream ends with. The kinds of prepared answer, each with
its own `events`, are in rag.answer.kinds.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from rag.answer.cite import Citation, Span, Visible
from rag.answer.extract import Quote
from rag.answer.history import Resolved
from rag.deadline import Deadline
from rag.engine.protocol import GenerationBackend
from rag.engine.sequence import TokenEvent, Usage
from rag.retrieve import Passage, SearchResult

NOT_FOUND = "The documents do not contain an answer to this question."
NO_USAGE = Usage(0, 0, 0)


@dataclass(kw_only=True)
class Prepared:
    """What exists before the first token: the passages given, and for a generated answer
    the running generation. One of the kinds in rag.answer.kinds, each with its own `events`."""

    tenant_id: str
    collection_id: str  # "" for plain chat
    passages: list[Passage]  # those given (to the model, or quoted), numbered from 1
    search: SearchResult | None
    deadline: Deadline
    timings_ms: dict[str, float]
    request_id: str
    mode: str = "generate"  # generate | extractive
    # The question as searched and answered (a follow-up made stand-alone), and how.
    resolved: Resolved | None = None

    @property
    def searched_query(self) -> str | None:
        return self.resolved.query if self.resolved is not None else None

    @property
    def stream(self) -> AsyncIterator[TokenEvent] | None:
        """The running generation, if any (a client that goes away cancels it)."""
        return None

    def events(
        self, engine: GenerationBackend | None, visible: Visible
    ) -> AsyncGenerator[str | Final, None]:
        raise NotImplementedError


@dataclass(kw_only=True)
class Running(Prepared):
    """A generation submitted to the engine."""

    generation: AsyncIterator[TokenEvent]
    submitted_at: float = 0.0
    prompt_tokens: int = 0

    @property
    def stream(self) -> AsyncIterator[TokenEvent] | None:
        return self.generation


@dataclass
class Final:
    answer: str
    citations: list[Citation]
    usage: Usage
    timings_ms: dict[str, float]
    # stop | length | repetition | deadline | cancelled | error | no_passages | no_evidence
    # | not_indexed
    finish_reason: str
    unsupported: list[Span] = field(default_factory=list)  # sentences no passage supports
    echoed: list[Span] = field(default_factory=list)  # sentences of the system instruction
    quotes: list[Quote] = field(default_factory=list)  # the extractive mode's sentences
    # finish reason "repetition": where the streamed text's repeated tail lies ([start, end)
    # of the concatenated pieces; already streamed, a client may hide it). `answer` leaves it
    # out.
    repeated: Span | None = None
    # Where the answer came from: "generated" (the generator wrote it, or a checked sentence
    # of it follows the quote), "quoted" (sentences of the documents only) or "refused".
    answer_source: str = "generated"
