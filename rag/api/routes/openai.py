"""OpenAI-compatible chat: POST /v1/chat/completions and GET /v1/models.

`model` chooses what answers:

- a collection of the caller's tenant, by id or by name: a grounded answer over it (the last
  user message is the question; the earlier user messages and the assistant's replies are
  the conversation's history, so a follow-up is made stand-alone before it is searched, and
  the prompt carries the latest turns; `rewrite: false` searches it as asked); the passages
  given come back in the extra field `sources`, each marked `cited` or not with the answer's
  sentences that cite it (and in full in `passages`), and the query searched in
  `ragserve.searched_query`, on the response and on the final chunk of a stream. Nothing is
  stored: the client sends the whole history each time. A history past RAG_ASK__MAX_HISTORY_*
  loses its oldest turns (the client cannot choose what it sends);
- the generator's own model name (``smollm2`` for the bundled model, the remote model's name
  with a remote backend): plain chat with no retrieval. Any authenticated key may use it: it
  reads no documents, and it is refused early like every generation when the engine is full.

OpenAI's finish reasons are fixed: an answer the engine stopped because it began repeating
itself finishes with "stop", and the choice's extra field `ragserve_finish_reason` says
"repetition" (it carries ragserve's own reason on every response: no_evidence, deadline, ...).

Errors are ordinary ragserve JSON errors, ``{"error": {"code", "message"}}``, which the
official client reads as OpenAI errors.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTasks

from rag.answer import AskRequest, Final, Prepared, cancel, chat, collect, tokens
from rag.answer.ask import prepare as prepare_answer
from rag.answer.history import Turn
from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, WITH_BODY, errors
from rag.api.pools import Pools
from rag.api.routes.ask import finished
from rag.api.schemas_ask import ChatCompletionIn, ModelList, ModelOut, opaque
from rag.api.schemas_search import passages_out
from rag.config import Settings
from rag.db import collections
from rag.db.models import Collection
from rag.engine.sequence import SamplingParams
from rag.errors import GenerationFailed, Invalid, NotFound
from rag.knobs import Knobs
from rag.ops.logs import new_id
from rag.ops.metrics import observe_stages
from rag.quota import Slot, released_after
from rag.services import Services

router = Router(tags=["openai"], responses=AUTHENTICATED)

_REASONS = {"stop": "stop", "length": "length", "deadline": "length"}


def generator_model(settings: Settings) -> str:
    """The name under which plain chat (no retrieval) is offered."""
    engine = settings.engine
    if engine.backend == "remote":
        return engine.remote_model or "default"
    return Path(engine.model_path).stem if engine.model_path else "smollm2"


def model_ids(rows: list[Collection], generator: str) -> dict[str, str]:
    """Collection id -> the id it is listed under: its name (what clients such as the
    `openai` library show), unless the name could mean something else here (the generator,
    or another collection's id); then its id. Both are accepted as `model`."""
    ids = {c.id for c in rows}
    return {
        c.id: c.name if c.name != generator and (c.name not in ids or c.name == c.id) else c.id
        for c in rows
    }


def _find_collection(services: Services, tenant_id: str, model: str) -> Collection | None:
    with services.db.read() as session:
        return collections.find(session, model, tenant_id=tenant_id)


def _live_collections(services: Services, tenant_id: str) -> list[Collection]:
    with services.db.read() as session:
        return collections.list_live(session, tenant_id)


@router.get("/v1/models", response_model=ModelList)
async def models(services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep) -> ModelList:
    """The caller's collections (answers grounded in them) and the generator (plain chat)."""
    generator = generator_model(services.settings)
    rows = await pools.db.run(_live_collections, services, principal.tenant_id)
    listed = model_ids(rows, generator)
    data = [
        ModelOut(
            id=listed[c.id],
            created=int(c.created_at),
            owned_by=principal.tenant_name,
            name=c.name,
            kind="collection",
            collection_id=c.id,
        )  # fmt: skip
        for c in rows
    ]
    data.append(ModelOut(id=generator, created=0, owned_by="ragserve", name=None, kind="generator"))
    return ModelList(data=data)


@router.post(
    "/v1/chat/completions",
    responses={
        200: {
            "description": "a chat.completion, or with `stream` chat.completion.chunk events",
            "content": {"text/event-stream": {}},
        },
        **WITH_BODY,
        **errors(404, 502),
    },
)
async def chat_completions(
    body: ChatCompletionIn, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> Any:
    """OpenAI chat completions; `model` is a collection (grounded) or the generator (plain)."""
    params = SamplingParams(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature if body.temperature is not None else 0.0,
        top_p=body.top_p if body.top_p is not None else 1.0,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stops(),
    )
    slot = services.asks.take(principal.tenant_id)  # 429 past the tenant's answers in flight
    try:
        return await _complete(body, services, principal.tenant_id, pools, params, slot)
    except BaseException:
        slot.release()
        raise


async def _complete(
    body: ChatCompletionIn,
    services: Services,
    tenant_id: str,
    pools: Pools,
    params: SamplingParams,
    slot: Slot,
) -> Any:
    """The answer, holding the tenant's slot: released here, or by the stream when it ends."""
    collection = await pools.db.run(_find_collection, services, tenant_id, body.model)
    req: AskRequest | None = None  # plain chat: no documents, no record
    answer_id: str | None = None
    if collection is not None:
        question = body.question()
        if question is None:  # the schema already says so
            raise Invalid("messages: no user message with text to answer")
        req = AskRequest(
            question, Knobs(k=body.k), None, params, body.budget_ms, mode=body.mode,
            frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
            history=_latest(body.history(), services.settings), rewrite=body.rewrite,
        )  # fmt: skip
        prep = await prepare_answer(services, tenant_id, collection.id, req, pools.search.run)
        answer_id = services.quality.new_id(prep) if services.quality is not None else None
    elif body.model == generator_model(services.settings):
        messages = [(m.role, m.text()) for m in body.messages]
        params = replace(
            params,
            frequency_penalty=body.frequency_penalty or 0.0,
            presence_penalty=body.presence_penalty or 0.0,
        )
        prep = await chat.prepare(services, tenant_id, messages, params, body.budget_ms)
    else:
        raise NotFound(f"model {body.model!r} is neither a collection of yours nor the generator")

    cid = "chatcmpl-" + new_id()
    created = int(time.time())
    if not body.stream:
        final = await collect(services, prep)
        slot.release()
        observe_stages("chat", final.timings_ms)
        if req is not None:
            finished(services, answer_id, prep, final, req)
        if final.finish_reason == "error":  # OpenAI's finish reasons have no word for it
            raise GenerationFailed("the generator failed while answering; try again")
        return {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": final.answer},
                    "finish_reason": _REASONS.get(final.finish_reason, "stop"),
                    "ragserve_finish_reason": final.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": _usage(final),
            **_extras(prep, final, answer_id),
        }
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    cleanup = BackgroundTasks()
    cleanup.add_task(cancel, services, prep)
    cleanup.add_task(slot.release)
    return StreamingResponse(
        released_after(
            slot,
            _chunks(services, prep, cid, created, body.model, include_usage, req, answer_id),
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=cleanup,
    )


async def _chunks(
    services: Services,
    prep: Prepared,
    cid: str,
    created: int,
    model: str,
    include_usage: bool,
    req: AskRequest | None,
    answer_id: str | None,
) -> AsyncIterator[bytes]:
    def chunk(
        delta: dict[str, Any], reason: str | None = None, own: str | None = None, **extra: Any
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        if own is not None:
            choice["ragserve_finish_reason"] = own
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
            **extra,
        }
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    stream = tokens(services, prep)
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for item in stream:
            if not isinstance(item, Final):
                yield chunk({"content": item})
                continue
            observe_stages("chat", item.timings_ms)
            if req is not None:
                finished(services, answer_id, prep, item, req)
            if item.finish_reason == "error":
                # A failure is an error event, never a normal finish.
                failure = {"error": {"code": "generation_failed", "message": "the generator "
                                     "failed while answering; try again"}}  # fmt: skip
                yield f"data: {json.dumps(failure)}\n\n".encode()
                continue
            reason = _REASONS.get(item.finish_reason, "stop")
            extras = _extras(prep, item, answer_id)
            yield chunk({}, reason, item.finish_reason, **extras, usage=_usage(item))
            if include_usage:
                usage_only = {
                    "id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [], "usage": _usage(item),
                }  # fmt: skip
                yield f"data: {json.dumps(usage_only)}\n\n".encode()
    finally:
        await stream.aclose()  # cancels the generation if it is still running
    yield b"data: [DONE]\n\n"


def _latest(turns: list[tuple[str, str]], settings: Settings) -> tuple[Turn, ...]:
    """The latest turns within the history's bounds (the oldest dropped first)."""
    ask = settings.ask
    kept: list[Turn] = []
    chars = 0
    for question, answer in reversed(turns[-ask.max_history_turns :] if ask.max_history_turns
                                     else []):  # fmt: skip
        chars += len(question) + len(answer)
        if chars > ask.max_history_chars:
            break
        kept.append(Turn(question, answer))
    return tuple(reversed(kept))


def _usage(final: Final) -> dict[str, Any]:
    u = final.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": u.cached_prompt_tokens,
            # ragserve's own: passage KV reused from the passage cache, and recomputed.
            "reused_tokens": u.reused_prompt_tokens,
            "recomputed_tokens": u.recomputed_prompt_tokens,
        },
    }


def _extras(prep: Prepared, final: Final, answer_id: str | None = None) -> dict[str, Any]:
    return {
        "sources": sources(prep, final),
        "passages": [p.model_dump() for p in passages_out(prep.passages)],
        "ragserve": {
            "answer_id": answer_id,
            "finish_reason": final.finish_reason,
            "answer_source": final.answer_source,
            "mode": prep.mode,
            "unsupported": final.unsupported,
            "echoed": final.echoed,
            "repeated": final.repeated,
            "quotes": [opaque(prep.passages, q) for q in final.quotes],
            "timings_ms": final.timings_ms,
            "searched_query": prep.searched_query,
            "rewritten": prep.resolved.rewritten if prep.resolved else False,
        },
    }


def sources(prep: Prepared, final: Final) -> list[dict[str, Any]]:
    """Every passage given, [1] first, marked `cited` when the answer cites it (a marker it
    wrote, or sentences the server attributed to it: `attributed`)."""
    cited = {c.marker: c for c in final.citations}
    out = []
    for n, p in enumerate(prep.passages, start=1):
        c = cited.get(n)
        out.append({
            "marker": n, "chunk_id": p.uid, "document_id": p.document_id,
            "filename": p.filename, "start_char": p.start_char, "end_char": p.end_char,
            "cited": c is not None, "attributed": c is not None and c.attributed,
            "sentences": list(c.sentences) if c is not None else [],
        })  # fmt: skip
    return out
