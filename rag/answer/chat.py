"""Plain chat (no retrieval): the caller's messages straight to the generator, through the
same admission, submission and stream as a grounded answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rag.answer.generate import admit, start
from rag.answer.kinds import Generating
from rag.answer.prepared import Prepared
from rag.deadline import Deadline
from rag.engine.sequence import SamplingParams
from rag.errors import Invalid
from rag.ops.logs import new_id

if TYPE_CHECKING:
    from rag.services import Services

# Roles the generator's chat template knows; OpenAI's "developer" is its system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


async def prepare(
    services: Services,
    tenant_id: str,
    messages: Sequence[tuple[str, str]],
    params: SamplingParams,
    budget_ms: float | None,
) -> Prepared:
    """`messages` as (role, text); other roles (tools) are left out. Their size is checked
    before anything is tokenized: the local engine tokenizes in `submit`, on the event loop
    (its stream is bound to the running loop), so only a bounded prompt may get there."""
    limit = services.settings.ask.max_chat_chars
    chars = sum(len(text) for _, text in messages)
    if chars > limit:
        raise Invalid(f"messages hold {chars} characters of text; the limit is {limit}")
    engine = await asyncio.to_thread(lambda: services.engine)
    admit(engine)
    chat = [{"role": _ROLES[role], "content": text} for role, text in messages if role in _ROLES]
    if not any(m["role"] == "user" for m in chat):
        raise Invalid("messages: at least one user message is needed")
    if params.max_tokens is None:
        params = replace(params, max_tokens=services.settings.ask.default_max_tokens)
    request_id = "chat-" + new_id()
    stream = start(engine, chat, params, request_id, cache_salt=tenant_id)
    return Generating(
        tenant_id=tenant_id, collection_id="", passages=[], search=None,
        deadline=Deadline.after_ms(budget_ms), timings_ms={}, request_id=request_id,
        generation=stream, submitted_at=time.perf_counter(),
    )  # fmt: skip
