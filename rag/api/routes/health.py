from __future__ import annotations

from fastapi import APIRouter

from rag import __version__
from rag.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Process alive. The only endpoint that needs no API key."""
    return Health(status="ok", version=__version__)
