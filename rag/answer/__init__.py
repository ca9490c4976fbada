"""The answer path, shared by POST /ask and /v1/chat/completions: `ask.prepare` (admit →
retrieve → threshold → prompt → submit) or `chat.prepare` (plain chat), then
`generate.tokens` (the stream to one Final, cited by `cite`)."""

from rag.answer.ask import NOT_FOUND, NOTHING_INDEXED, AskRequest
from rag.answer.cite import Citation, cite, markers
from rag.answer.generate import Final, Prepared, cancel, collect, tokens

__all__ = [
    "NOTHING_INDEXED",
    "NOT_FOUND",
    "AskRequest",
    "Citation",
    "Final",
    "Prepared",
    "cancel",
    "cite",
    "collect",
    "markers",
    "tokens",
]
