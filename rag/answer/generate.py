"""From a prepared answer to the final event. A `Prepared` answer (rag.answer.prepared) is
one of four kinds, each with its own `events()` (rag.answer.kinds).

`start` admits and submits (overload refused before any work: HTTP 429); `tokens` yields the
text pieces, then one `Final`, whose `answer_source` says where the answer came from
(generated / quoted / refused). The deadline stops a generation (finish reason `deadline`), a
client that goes away cancels it and frees its KV blocks (rag.answer.run), and citations are
checked against SQL before they are given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from rag.answer.cite import Visible, visible_in
from rag.answer.prepared import Final, Prepared
from rag.engine.protocol import GenerationBackend, Prompt
from rag.engine.sequence import EngineOverloaded, InvalidRequest, SamplingParams, TokenEvent
from rag.errors import Invalid, Overloaded

if TYPE_CHECKING:
    from rag.services import Services

log = logging.getLogger(__name__)


def admit(engine: GenerationBackend) -> None:
    """Refuse at once when the generator is full (HTTP 429)."""
    if not engine.has_room():
        log.warning("generation refused: the generator is full")
        raise Overloaded("the generator's queue is full", retry_after_s=1.0)


def start(
    engine: GenerationBackend,
    prompt: Prompt,
    params: SamplingParams,
    request_id: str,
    *,
    cache_salt: str | None = None,
) -> AsyncIterator[TokenEvent]:
    """Submit, with the engine's refusals as the domain's errors (429, 422). `cache_salt`
    (the tenant) keeps the engine's prefix cache from matching another tenant's prompts."""
    try:
        return engine.submit(prompt, params, request_id, cache_salt=cache_salt)
    except EngineOverloaded as exc:
        raise Overloaded(str(exc), retry_after_s=exc.retry_after_s) from None
    except InvalidRequest as exc:
        raise Invalid(str(exc)) from None


def cancel(services: Services, prep: Prepared) -> None:
    """Free a generation's KV blocks now; harmless when it already finished."""
    if prep.stream is not None:
        services.engine.cancel(prep.request_id)


async def tokens(services: Services, prep: Prepared) -> AsyncGenerator[str | Final, None]:
    """The answer's text as it is written, then one Final (with the time of each stage).
    Closing this iterator early (a client that went away) cancels the generation."""
    engine = services.engine if prep.stream is not None else None
    visible = visible_in(services.db, prep.tenant_id, prep.collection_id)
    async with contextlib.aclosing(stream(engine, prep, visible)) as items:
        async for item in items:
            yield item


def stream(
    engine: GenerationBackend | None, prep: Prepared, visible: Visible
) -> AsyncGenerator[str | Final, None]:
    """`tokens` for a given engine and SQL check (`visible`: chunk ids -> those the caller
    may still see), so a benchmark can run the same path over passages of its own."""
    return prep.events(engine, visible)


async def collect(services: Services, prep: Prepared) -> Final:
    """The whole answer at once. A caller that goes away meanwhile cancels it too."""
    final: Final | None = None
    async with contextlib.aclosing(tokens(services, prep)) as stream:
        async for item in stream:
            if isinstance(item, Final):
                final = item
    assert final is not None  # tokens() always ends with one
    return final
