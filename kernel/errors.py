"""The error tree: one stable snake_case ``code`` per class, and the one code → HTTP status table.

Imports nothing of ours. The API (`kernel/api/errors.py`, the envelope) and the console (error
pages) both answer with `CODE_TO_STATUS`. A policy deny is a result, never one of these exceptions.
"""

from __future__ import annotations

from typing import Any

# The one code → status table; a code missing from it answers 500.
CODE_TO_STATUS: dict[str, int] = {
    "validation_error": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "execution_terminal": 409,
    "lease_superseded": 409,
    "payload_too_large": 413,
    "internal_error": 500,
    "overloaded": 503,
    "unavailable": 503,
}


class RegentError(Exception):
    """Base class: every error a caller can see carries a code and a message."""

    code = "internal_error"
    default_message = "internal error"

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None):
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)


class ValidationError(RegentError):
    code = "validation_error"
    default_message = "validation error"


def invalid(message: str) -> ValidationError:
    """What every validation failure raises: a ValidationError reading "validation error: <message>"."""
    return ValidationError(f"validation error: {message}")


class Unauthorized(RegentError):
    code = "unauthorized"
    default_message = "unauthorized"


class Forbidden(RegentError):
    code = "forbidden"
    default_message = "forbidden"


class NotFound(RegentError):
    code = "not_found"
    default_message = "not found"


class Conflict(RegentError):
    code = "conflict"
    default_message = "conflict"


class ExecutionTerminal(RegentError):
    code = "execution_terminal"
    default_message = "execution is terminal"


class LeaseSuperseded(RegentError):
    code = "lease_superseded"
    default_message = "dispatch lease superseded"


class Overloaded(RegentError):
    """Admission control: the undelivered backlog is past its bound; retry after `retry_after` s."""

    code = "overloaded"
    default_message = "overloaded"

    def __init__(self, message: str | None = None, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class StoreUnavailable(RegentError):
    code = "unavailable"
    default_message = "store unavailable"


class StoreConflict(Exception):
    """A write broke one of the store's constraints (a unique key taken, a referenced row gone):
    the store raises it in place of its driver's integrity error, so the core never sees SQL.

    Not a `RegentError`: a use case that expects a race catches it (a repeated idempotency key),
    and one that escapes is a fault, answered 500 `internal_error` and logged, as Rebuno v0
    answers a store's constraint violation (docs/api.md)."""


class ConfigError(RegentError):
    """A setting, manifest or bundle file is unusable at start-up (the CLI prints it and exits)."""

    code = "config_error"
    default_message = "configuration error"
