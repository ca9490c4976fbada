"""Warming a collection's passages into the generator's passage KV cache.

A passage's KV is otherwise computed the first time a question retrieves it (rag.engine.
passages). A warm-up computes them ahead, each in a prompt of its own (the system instruction,
then the passage as passage 1), oldest chunks first, one at a time, into the cache's free room
only: it stops before a passage would evict anything (another tenant's passages, or what it
just computed), and once it has filled `ask.warm_max_share` of the cache, so one tenant's
warm-ups cannot push the others' passages out. Each warm prompt is a one-token
generation like any other request, so warming never holds back a user's question for more than
one prompt's prefill.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.answer import prompt as prompts
from rag.db import chunks, collections
from rag.engine.protocol import estimate_tokens
from rag.engine.sequence import SamplingParams
from rag.errors import Conflict

if TYPE_CHECKING:
    from rag.services import Services

log = logging.getLogger(__name__)

ONE_TOKEN = SamplingParams(max_tokens=1)


@dataclass(frozen=True)
class WarmPassage:
    chunk_id: int
    text: str
    filename: str
    score: float = 1.0


def passages(
    services: Services, tenant_id: str, collection_id: str, limit: int
) -> list[WarmPassage]:
    """What a warm-up will compute (404 for another tenant's or a missing collection; 409
    when the generator keeps no passage cache: the server's state, not the request's)."""
    if services.engine.metrics().passages.capacity_bytes <= 0:
        raise Conflict("the generator keeps no passage cache (RAG_ENGINE__PASSAGE_CACHE_MB=0 "
                      "or a remote generator)")  # fmt: skip
    with services.db.read() as session:
        collections.get(session, tenant_id, collection_id)
        rows = chunks.passages_of(session, tenant_id, collection_id, limit)
    return [WarmPassage(r.id, r.text, r.filename) for r in rows]


async def warm(services: Services, tenant_id: str, items: list[WarmPassage]) -> int:
    """Compute each passage's KV into the cache's free room, up to this warm-up's share of
    it; returns how many were."""
    engine = services.engine
    done = 0
    start = engine.metrics().passages
    evicted = start.evictions
    share = int(start.capacity_bytes * services.settings.ask.warm_max_share)
    for item in items:
        now = engine.metrics().passages
        if now.evictions > evicted:
            break  # the estimate fell short: stop at once
        # Its size, from the cache's bytes a token (none stored yet: the cache is empty, so
        # nothing can be evicted); a margin for the header and the tokenizer's count.
        need = now.token_bytes * (estimate_tokens(prompts.segment_text(item)) + 16)
        if now.bytes + need > now.capacity_bytes or now.bytes - start.bytes + need > share:
            break
        prompt = prompts.segmented("", [item], salt=tenant_id, kv_reuse="blend")
        try:
            async for _ in engine.submit(prompt, ONE_TOKEN, cache_salt=tenant_id):
                pass
        except Exception:  # overloaded or closing: warming is best effort
            log.info("warm-up stopped after %d passages", done, exc_info=True)
            break
        done += 1
    log.info("warmed %d passages into the passage cache", done)
    return done
