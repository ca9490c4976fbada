"""POST /v1/collections/{id}/ask: a grounded answer, as one JSON body or server-sent events.

The stream is three kinds of events, in order: one ``passages`` (what the model was given,
numbered from [1]), any number of ``token`` (text as it is written), and one ``final``
(answer id, answer, citations, the sentences no passage supports, usage, timings, finish
reason, the query searched; in extractive mode the quotes with their spans). The answer id is
what POST /v1/answers/{id}/feedback rates (null when quality.enabled is off). Errors found
before the first token (bad input, unknown collection or conversation, overload, a history past
its bounds) are ordinary HTTP errors, never a started stream.

With `conversation_id`, the conversation's turns are the history and the answer is added to
it as a turn (rag.api.conversations); with `history`, the client's turns are, and nothing is
stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Path, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTasks

from rag.answer import AskRequest, Final, Prepared, cancel, collect, tokens
from rag.answer.ask import prepare as prepare_answer
from rag.answer.history import Turn
from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.errors import body as error_body
from rag.api.mapping import retrieval
from rag.api.openapi import WITH_BODY, errors
from rag.api.routes import conversations
from rag.api.schemas_ask import (
    AskIn,
    AskOut,
    CitationOut,
    QuoteOut,
    UsageOut,
    opaque,
)
from rag.api.schemas_search import passages_out
from rag.engine.sequence import SamplingParams
from rag.errors import RagError
from rag.ops.metrics import observe_answer, observe_stages
from rag.quota import released_after
from rag.services import Services

log = logging.getLogger(__name__)
router = Router(tags=["ask"])

# How often a streaming answer checks that its client is still there.
DISCONNECT_POLL_S = 0.1


def ask_request(body: AskIn, history: tuple[Turn, ...] = ()) -> AskRequest:
    knobs, filt = retrieval(body)
    return AskRequest(
        question=body.question,
        knobs=knobs,
        filter=filt,
        params=SamplingParams(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=tuple(body.stop or ()),
        ),  # fmt: skip
        budget_ms=body.budget_ms,
        kv_reuse=body.kv_reuse,
        mode=body.mode,
        evidence=body.evidence,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty,
        history=history or tuple(Turn(t.question, t.answer) for t in body.history or ()),
        rewrite=body.rewrite,
    )


def final_out(prep: Prepared, final: Final, answer_id: str | None = None) -> dict[str, Any]:
    search = prep.search
    return {
        "answer_id": answer_id,
        "answer": final.answer,
        "citations": [
            CitationOut(**opaque(prep.passages, c)).model_dump() for c in final.citations
        ],
        "usage": UsageOut.of(final.usage).model_dump(),
        "timings_ms": final.timings_ms,
        "finish_reason": final.finish_reason,
        "answer_source": final.answer_source,
        "mode": prep.mode,
        "unsupported": final.unsupported,
        "echoed": final.echoed,
        "repeated": final.repeated,
        "quotes": [QuoteOut(**opaque(prep.passages, q)).model_dump() for q in final.quotes],
        "knobs": search.knobs_used() if search else {},
        "degradations": search.degraded if search else [],
        "partial": search.partial if search else False,
        "searched_query": prep.searched_query,
        "rewritten": prep.resolved.rewritten if prep.resolved else False,
    }


def finished(
    services: Services,
    answer_id: str | None,
    prep: Prepared,
    final: Final,
    req: AskRequest,
    turn: conversations.Joined | None = None,
) -> None:
    """An answer is complete: its record queued (off the answer's path, and tied to the
    conversation it is a turn of) and its quality signals counted. Never raises, never
    waits."""
    if services.quality is None:
        return
    conversation_id = turn.conversation_id if turn is not None else None
    row = services.quality.record(answer_id, prep, final, req, conversation_id)
    if row is not None:
        observe_answer(row)


def sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


@router.post(
    "/v1/collections/{collection_id}/ask",
    response_model=AskOut,
    responses={200: {"content": {"text/event-stream": {}}}, **WITH_BODY, **errors(404)},
)
async def ask(
    collection_id: Annotated[str, Path(max_length=64)],
    body: AskIn,
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> Any:
    """Answer a question from the collection's documents, with citations. With `stream`, the
    answer comes as server-sent events: `passages`, then `token`s, then `final`. Retrieval
    runs on the search threads, in the tenant's line (429 when it is full)."""
    slot = services.asks.take(principal.tenant_id)  # 429 past the tenant's answers in flight
    streaming = False
    try:
        turn: conversations.Joined | None = None
        if body.conversation_id is not None:
            turn = await pools.db.run(
                conversations.join, services, principal, collection_id, body.conversation_id,
                body.question,
            )  # fmt: skip
        req = ask_request(body, turn.history if turn else ())
        prep = await prepare_answer(
            services, principal.tenant_id, collection_id, req, pools.search.run
        )
        answer_id = services.quality.new_id(prep) if services.quality is not None else None
        if not body.stream:
            final = await collect(services, prep)
            observe_stages("ask", final.timings_ms)
            finished(services, answer_id, prep, final, req, turn)
            out = final_out(prep, final, answer_id)
            if turn is not None:
                await pools.db.run(conversations.record, services, turn, body.question, prep, out)
            return AskOut(passages=passages_out(prep.passages), **out)
        # Harmless when the generation already finished; frees it when the body never ran.
        cleanup = BackgroundTasks()
        cleanup.add_task(cancel, services, prep)
        cleanup.add_task(slot.release)
        streaming = True
        return StreamingResponse(
            released_after(
                slot, _events(services, prep, request, req, answer_id, turn, body.question)
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=cleanup,
        )
    finally:
        if not streaming:
            slot.release()


async def _events(
    services: Services, prep: Prepared, request: Request, req: AskRequest,
    answer_id: str | None, turn: conversations.Joined | None = None, question: str = "",
) -> AsyncIterator[bytes]:  # fmt: skip
    watcher = asyncio.create_task(_watch_disconnect(request, services, prep))
    stream = tokens(services, prep)
    try:
        passages = [p.model_dump() for p in passages_out(prep.passages)]
        yield sse("passages", {"passages": passages})
        async for item in stream:
            if isinstance(item, Final):
                observe_stages("ask", item.timings_ms)
                finished(services, answer_id, prep, item, req, turn)
                out = final_out(prep, item, answer_id)
                if turn is not None:
                    try:
                        await asyncio.to_thread(
                            conversations.record, services, turn, question, prep, out
                        )
                    except RagError as exc:  # the answer stands; the turn was not stored
                        yield sse("error", error_body(exc.code, exc.message, exc.detail))
                        out["conversation_id"] = None
                yield sse("final", out)
            else:
                yield sse("token", {"text": item})
    finally:
        watcher.cancel()
        await stream.aclose()  # cancels the generation if it is still running


async def _watch_disconnect(request: Request, services: Services, prep: Prepared) -> None:
    """Cancel the generation as soon as the client goes away, even between tokens."""
    with contextlib.suppress(asyncio.CancelledError):
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        if prep.stream is not None:
            log.info("client went away; cancelling %s", prep.request_id)
            cancel(services, prep)
