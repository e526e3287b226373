"""Small helpers shared by the routers: the kernel from app state, ids, a signed route's opening, threads."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path, request_response

from kernel.api.auth import AgentCall, Authenticator, Repeat
from kernel.core.kernel import Kernel
from kernel.domain import Lease
from kernel.errors import ValidationError, invalid
from kernel.ids import parse_uuid
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
        raise invalid(f"invalid {what} {value!r}") from None


def agent_param(value: str) -> str:
    """An agent id from the path or query: 400 when no store could hold it (NUL, lone surrogate);
    any other string is looked up (ids registered before the id grammar keep working)."""
    return check_text(value, "agent id")


def step_param(value: str) -> str:
    """A step id from the path, lower-cased (step ids are 64 hex characters)."""
    return check_text(value, "step id").lower()


async def signed_on(request: Request, execution_id: str, repeat: Repeat,
                    *, with_call: bool = False) -> tuple[AgentCall, str]:
    """How every agent-signed route on one execution opens: the signature verified (401) and the
    execution id read from the path (400). The route then parses its body and only then reads the
    dispatch lease (`lease`), so a malformed body is answered first; whether the agent owns the
    execution and holds the lease is the use case's check, inside its transaction."""
    a = await auth_of(request).agent(request, repeat, with_call=with_call)
    return a, uuid_param(execution_id, "execution id")


def lease(a: AgentCall, execution_id: str) -> Lease:
    """The agent's lease on `execution_id`, from its two dispatch headers (`AgentCall.lease`: a
    canonical dispatch id, an attempt ≥ 1), or 400."""
    return Lease(a.agent_id, execution_id, *a.lease())


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
