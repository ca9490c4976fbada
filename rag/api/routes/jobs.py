from __future__ import annotations

import time
from typing import Annotated

from fastapi import Path, Query, Request

from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, errors
from rag.api.schemas import JobOut
from rag.db import jobs

router = Router(prefix="/v1/jobs", tags=["jobs"], responses=AUTHENTICATED)


@router.get("/{job_id}", response_model=JobOut, responses=errors(404))
async def get_job(
    job_id: Annotated[str, Path(max_length=64)],
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
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
    so a client learns without polling when its upload is searchable. Long polls are
    bounded (`api.max_long_polls`, then 429), share one look at the job that comes less and
    less often (rag.api.jobwatch), and stop when the client goes away."""

    def load() -> JobOut:
        with services.db.read() as session:
            return JobOut.of(jobs.get(session, principal.tenant_id, job_id))

    key = (principal.tenant_id, job_id)
    read = lambda: pools.db.run(load)  # noqa: E731
    job = await (pools.jobs.first_look(key, read) if wait > 0 else read())
    if job.done or wait <= 0:
        return job
    deadline = time.monotonic() + min(wait, services.settings.api.long_poll_max_s)
    with pools.long_poll():
        return await pools.jobs.wait(key, job, read, deadline, request.receive)
