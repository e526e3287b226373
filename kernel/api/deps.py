"""Small helpers shared by the routers: the kernel from app state, ids, lease headers, threads."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path, request_response

from kernel.api.auth import AgentCall, Authenticator
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.errors import ValidationError
from kernel.ids import parse_uuid, whole_number
from kernel.lane import call, call_hot, long_lived  # noqa: F401 - the routers take them from here
from kernel.text import check_text


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


def lease(a: AgentCall, execution_id: str) -> Lease:
    """The agent's lease on `execution_id`, from its two dispatch headers (a canonical dispatch id,
    an attempt ≥ 1), or 400."""
    dispatch_id, attempt = a.dispatch_id, a.dispatch_attempt
    if not dispatch_id:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Id")
    try:
        did = parse_uuid(dispatch_id)
    except ValidationError:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Id") from None
    n = whole_number((attempt or "").strip())
    if n is None or n < 1:
        raise ValidationError("validation error: bad or missing Rebuno-Dispatch-Attempt")
    return Lease(a.agent_id, execution_id, did, n)


class LeanRoute(APIRoute):
    """A hot route, declared and documented as FastAPI routes are (OpenAPI, `openapi_extra`) but
    served as a plain Starlette endpoint.

    The endpoint takes its path parameters (strings, as Starlette's default convertor gives them)
    and the Request, parses its own body and returns a Response, so FastAPI's per-request
    dependency solving, parameter validation and exit stacks have nothing to do; on a step round
    trip they were about a fifth of the event loop's CPU (bench/README.md). Exceptions reach the
    app's handlers exactly as from any route. In the app they are served ahead of the middleware
    stack (kernel/api/hot.py `HotRoutes`); the route itself serves them only under a root path.
    """

    def __init__(self, path: str, endpoint: Callable[..., Awaitable[Response]], **kwargs: Any):
        super().__init__(path, endpoint, **kwargs)
        params = set(inspect.signature(endpoint).parameters)
        path_params = set(compile_path(path)[2])
        if params != path_params | {"request"}:
            raise TypeError(f"a lean route's endpoint takes its path parameters and request only: {path}")

        async def handler(request: Request) -> Response:
            return await endpoint(request=request, **request.path_params)

        self.app = request_response(handler)
