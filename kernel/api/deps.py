"""Small helpers shared by the routers: the kernel from app state, ids, lease headers, threads."""

from __future__ import annotations

from starlette.requests import Request

from kernel.api.auth import Authenticator
from kernel.api.body import check_text
from kernel.api.threads import call  # noqa: F401 - the routers take it from here
from kernel.core.kernel import Kernel
from kernel.errors import ValidationError
from kernel.identity import parse_uuid


def kernel_of(request: Request) -> Kernel:
    return request.app.state.kernel  # type: ignore[no-any-return]


def auth_of(request: Request) -> Authenticator:
    return request.app.state.auth  # type: ignore[no-any-return]


def uuid_param(value: str, what: str = "id") -> str:
    try:
        return parse_uuid(value)
    except ValidationError:
        raise ValidationError(f"validation error: invalid {what} {value!r}") from None


def agent_param(value: str) -> str:
    """An agent id from the path or query: 400 when no store could hold it (NUL, lone surrogate);
    any other string is looked up (ids registered before the id grammar keep working)."""
    return check_text(value, "agent id")


def step_param(value: str) -> str:
    """A step id from the path, lower-cased (step ids are 64 hex characters)."""
    return check_text(value, "step id").lower()


def lease(dispatch_id: str | None, attempt: str | None) -> tuple[str, int]:
    """The two dispatch headers → (canonical dispatch id, attempt ≥ 1), or 400."""
    if not dispatch_id:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Id")
    try:
        did = parse_uuid(dispatch_id)
    except ValidationError:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Id") from None
    text = (attempt or "").strip()
    if not text.isdigit() or int(text) < 1:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Attempt")
    return did, int(text)
