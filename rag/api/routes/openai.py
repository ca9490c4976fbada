"""OpenAI-compatible chat: POST /v1/chat/completions and GET /v1/models.

`model` chooses what answers:

- a collection of the caller's tenant, by id or by name: a grounded answer over it (the last
  user message is the question, earlier turns are not used for retrieval); its citations come
  back in the extra field `sources` (and the passages given in `passages`), on the response and
  on the final chunk of a stream;
- the generator's own model name (``smollm2`` for the bundled model, the remote model's name
  with a remote backend): plain chat with no retrieval. Any authenticated key may use it: it
  reads no documents, and it is refused early like every generation when the engine is full.

Errors are ordinary ragserve JSON errors, ``{"error": {"code", "message"}}``, which the
official client reads as OpenAI errors.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import or_, select
from starlette.background import BackgroundTask

from rag.answer import Answerer, AskRequest, Final, Prepared
from rag.api.deps import CurrentPrincipal, ServicesDep
from rag.api.routes.ask import passages_out
from rag.api.schemas_ask import ChatCompletionIn, ModelList, ModelOut
from rag.config import Settings
from rag.db.models import Collection
from rag.deadline import Deadline
from rag.engine.sequence import EngineOverloaded, InvalidRequest, SamplingParams
from rag.errors import Invalid, NotFound, Overloaded
from rag.metrics import observe_stages
from rag.retrieve import Knobs
from rag.services import Services

router = APIRouter(tags=["openai"])

_REASONS = {"stop": "stop", "length": "length", "deadline": "length"}


def generator_model(settings: Settings) -> str:
    """The name under which plain chat (no retrieval) is offered."""
    engine = settings.engine
    if engine.backend == "remote":
        return engine.remote_model or "default"
    return Path(engine.model_path).stem if engine.model_path else "smollm2"


def _find_collection(services: Services, tenant_id: str, model: str) -> Collection | None:
    with services.db.read() as session:
        rows = session.scalars(
            select(Collection)
            .where(
                Collection.tenant_id == tenant_id,
                Collection.deleted_at.is_(None),
                or_(Collection.id == model, Collection.name == model),
            )
            .order_by(Collection.created_at)
        ).all()
    # An id match wins over a name match (a collection may be named like another's id).
    found = [c for c in rows if c.id == model] or list(rows)
    return found[0] if found else None


@router.get("/v1/models", response_model=ModelList)
def models(services: ServicesDep, principal: CurrentPrincipal) -> ModelList:
    """The caller's collections (answers grounded in them) and the generator (plain chat)."""
    with services.db.read() as session:
        rows = session.scalars(
            select(Collection)
            .where(Collection.tenant_id == principal.tenant_id, Collection.deleted_at.is_(None))
            .order_by(Collection.created_at, Collection.id)
        ).all()
        data = [
            ModelOut(
                id=c.id,
                created=int(c.created_at),
                owned_by=principal.tenant_name,
                name=c.name,
                kind="collection",
            )  # fmt: skip
            for c in rows
        ]
    data.append(
        ModelOut(
            id=generator_model(services.settings),
            created=0,
            owned_by="ragserve",
            name=None,
            kind="generator",
        )
    )
    return ModelList(data=data)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionIn, request: Request, services: ServicesDep, principal: CurrentPrincipal
) -> Any:
    """OpenAI chat completions; `model` is a collection (grounded) or the generator (plain)."""
    answerer = Answerer(services)
    params = SamplingParams(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature if body.temperature is not None else 0.0,
        top_p=body.top_p if body.top_p is not None else 1.0,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stops(),
    )
    collection = await anyio.to_thread.run_sync(
        _find_collection, services, principal.tenant_id, body.model
    )
    if collection is not None:
        question = next((m.text() for m in reversed(body.messages) if m.role == "user"), "")
        if not question.strip():
            raise Invalid("messages: no user message with text to answer")
        req = AskRequest(question, Knobs(k=body.k), None, params, body.budget_ms)
        prep = await answerer.prepare(principal.tenant_id, collection.id, req)
    elif body.model == generator_model(services.settings):
        prep = await _plain(answerer, services, principal.tenant_id, body, params)
    else:
        raise NotFound(f"model {body.model!r} is neither a collection of yours nor the generator")

    cid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    if not body.stream:
        final: Final | None = None
        async with contextlib.aclosing(answerer.tokens(prep)) as tokens:
            async for item in tokens:
                if isinstance(item, Final):
                    final = item
        assert final is not None
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
                    "logprobs": None,
                }
            ],
            "usage": _usage(final),
            **_extras(prep, final),
        }
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(
        _chunks(answerer, prep, cid, created, body.model, include_usage),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(_cancel, services, prep),
    )


async def _plain(
    answerer: Answerer,
    services: Services,
    tenant_id: str,
    body: ChatCompletionIn,
    params: SamplingParams,
) -> Prepared:
    engine = await anyio.to_thread.run_sync(lambda: services.engine)
    answerer.admit(engine)
    messages = []
    for m in body.messages:
        role = {"developer": "system"}.get(m.role, m.role)
        if role in ("system", "user", "assistant"):
            messages.append({"role": role, "content": m.text()})
    if not any(m["role"] == "user" for m in messages):
        raise Invalid("messages: at least one user message is needed")
    if params.max_tokens is None:
        params = SamplingParams(
            **{**params.__dict__, "max_tokens": services.settings.ask.default_max_tokens}
        )
    request_id = "chat-" + uuid.uuid4().hex
    try:
        stream = engine.submit(messages, params, request_id)
    except EngineOverloaded as exc:
        raise Overloaded(str(exc), retry_after_s=exc.retry_after_s) from None
    except InvalidRequest as exc:
        raise Invalid(str(exc)) from None
    return Prepared(
        tenant_id, "", [], None, Deadline.after_ms(body.budget_ms), {}, request_id, stream,
        submitted_at=time.perf_counter(),
    )  # fmt: skip


async def _chunks(
    answerer: Answerer, prep: Prepared, cid: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> bytes:
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}],
            **extra,
        }
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    async with contextlib.aclosing(answerer.tokens(prep)) as tokens:
        yield chunk({"role": "assistant", "content": ""})
        async for item in tokens:
            if not isinstance(item, Final):
                yield chunk({"content": item})
                continue
            reason = _REASONS.get(item.finish_reason, "stop")
            yield chunk({}, reason, **_extras(prep, item), usage=_usage(item))
            if include_usage:
                usage_only = {
                    "id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [], "usage": _usage(item),
                }  # fmt: skip
                yield f"data: {json.dumps(usage_only)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _usage(final: Final) -> dict[str, Any]:
    u = final.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.generated_tokens,
        "total_tokens": u.prompt_tokens + u.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _extras(prep: Prepared, final: Final) -> dict[str, Any]:
    # Called once per answer on both paths (JSON and stream): the place to record its stages.
    observe_stages("chat", final.timings_ms)
    return {
        "sources": [asdict(c) for c in final.citations],
        "passages": [p.model_dump() for p in passages_out(prep)],
        "ragserve": {"finish_reason": final.finish_reason, "timings_ms": final.timings_ms},
    }


async def _cancel(services: Services, prep: Prepared) -> None:
    if prep.stream is not None:
        services.engine.cancel(prep.request_id)
