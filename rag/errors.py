"""The domain's errors. One place (rag.api.errors) maps them to HTTP."""

from __future__ import annotations


class RagError(Exception):
    """Base of every error the service reports to a caller."""

    code = "error"

    def __init__(self, message: str, *, detail: object | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class NotFound(RagError):
    code = "not_found"


class Invalid(RagError):
    code = "invalid"


class Unauthorized(RagError):
    code = "unauthorized"


class Forbidden(RagError):
    code = "forbidden"


class QuotaExceeded(Forbidden):
    """A tenant's quota (collections, documents, bytes) would be passed: HTTP 403. Waiting
    does not help; deleting something, or a larger quota, does."""

    code = "quota_exceeded"


class Conflict(RagError):
    code = "conflict"


class TooLarge(RagError):
    code = "too_large"


class UnsupportedMediaType(RagError):
    code = "unsupported_media_type"


class Overloaded(RagError):
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(RagError):
    """This process cannot serve the request now (a component closed or stopped, or it did
    not answer within the request's budget): HTTP 503; another replica, or later, may."""

    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GenerationFailed(RagError):
    """The generator failed while answering (reported as such, never as a normal finish)."""

    code = "generation_failed"


class ParseError(RagError):
    """A document could not be turned into text. Permanent: retrying will not help."""

    code = "parse_failed"
