from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from rag.api.deps import CurrentPrincipal, ServicesDep
from rag.api.schemas import JobOut
from rag.db import jobs

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("/{job_id}", response_model=JobOut)
async def get_job(
    job_id: str,
    services: ServicesDep,
    principal: CurrentPrincipal,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=600,
            description=(
                "long-poll: hold the request up to this many seconds until the job is done "
                "(indexed, failed or cancelled)"
            ),
        ),
    ] = 0,
) -> JobOut:
    """A job's state. With `wait`, answers as soon as the job is done or the wait is over,
    so a client learns without polling when its upload is searchable."""

    def load() -> JobOut:
        with services.db.read() as session:
            return JobOut.of(jobs.get(session, principal.tenant_id, job_id))

    deadline = time.monotonic() + min(wait, services.settings.api.long_poll_max_s)
    job = await run_in_threadpool(load)
    while not job.done and time.monotonic() < deadline:
        await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        job = await run_in_threadpool(load)
    return job
