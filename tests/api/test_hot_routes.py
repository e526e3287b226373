"""The hot routes served ahead of the middleware stack (kernel/api/hot.py) answer exactly as the
routes do through it: the same handlers, the same envelope, the connection kept. Over real HTTP
on loopback, on both stores."""

from __future__ import annotations

from contextlib import closing

import httpx
from sqlalchemy import text

from kernel.api.hot import HotRoutes
from kernel.core.kernel import Kernel
from tests.conftest import Running
from tests.support import AgentClient, ServerThread


def _poison(kernel: Kernel, eid: str) -> None:
    # A row the codec cannot read: the use case raises a real internal error.
    with kernel.store.engine.begin() as c:
        c.execute(text("UPDATE executions SET status = 'bogus' WHERE id = :id"), {"id": eid})


def test_the_hot_routes_are_served_ahead_of_the_stack(server: ServerThread, running: Running) -> None:
    eid, did, attempt = running.start()
    with closing(AgentClient(server.url, running.agent_id, running.secret).lease(did, attempt)) as agent:
        assert agent.submit(eid, "t", {"a": 1}).json()["decision"] == "proceed"
    stack = server.server.config.app.middleware_stack
    assert isinstance(stack, HotRoutes)
    assert sorted(len(routes) for routes in stack._routes.values()) == [2, 2]  # submit, heartbeat; complete, fail


def test_internal_error_on_a_hot_route_is_the_envelope_and_keeps_the_connection(
    server: ServerThread, running: Running, kernel: Kernel
) -> None:
    eid, did, attempt = running.start()
    _poison(kernel, eid)
    with closing(AgentClient(server.url, running.agent_id, running.secret).lease(did, attempt)) as agent:
        for _ in range(2):
            r = agent.submit(eid, "t", {"a": 1})
            assert r.status_code == 500 and r.json() == {"code": "internal_error", "message": "internal error"}
            assert r.headers.get("connection") != "close"
            assert agent.http.get("/v0/health").status_code == 200


def test_hot_route_errors_are_the_routes_errors(server: ServerThread, running: Running) -> None:
    eid, did, attempt = running.start()
    with closing(AgentClient(server.url, running.agent_id, running.secret).lease(did, attempt)) as agent:
        r = agent.request("POST", f"/v0/executions/{eid}/steps", {"kind": "tool_call"},
                          headers={"Rebuno-Signature": "v1=00"})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
        r = agent.request("POST", f"/v0/executions/{eid}/steps", {"kind": "tool_call", "target": "t", "bogus": 1})
        assert r.status_code == 400 and r.json() == {"code": "validation_error",
                                                    "message": 'validation error: unknown field "bogus"'}
        r = agent.request("POST", f"/v0/executions/{eid}/steps/x/complete", {"result": 1})
        assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_other_requests_on_hot_paths_go_through_the_router(server: ServerThread, running: Running) -> None:
    eid, _, _ = running.start()
    r = httpx.get(f"{server.url}/v0/executions/{eid}/heartbeat")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed" and r.headers["allow"] == "POST"
    r = httpx.post(f"{server.url}/v0/executions//steps")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_an_app_mounted_ahead_is_served_past_the_stack(kernel: Kernel) -> None:
    """`KernelApp.mount_ahead` (the MCP gateway in the kernel's process): its requests reach it with
    Starlette's mount scope (root path, route path) and skip the kernel's middlewares: a big
    answer to a client that accepts gzip is not compressed, as from a process of its own."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from kernel.api.app import create_app
    from kernel.api.hot import KernelApp

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"root_path": request.scope["root_path"], "id": request.path_params["id"],
                             "pad": "x" * 4096})

    app = create_app(kernel, dev=True, bearer_token="boot-token")
    assert isinstance(app, KernelApp)
    app.mount_ahead("/ahead", Starlette(routes=[Route("/things/{id}", echo, methods=["GET", "POST"])]))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        for method in ("GET", "POST"):
            r = http.request(method, "/ahead/things/7", headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200 and "content-encoding" not in r.headers
            assert r.json()["root_path"] == "/ahead" and r.json()["id"] == "7"
        # Other paths still go to the kernel's router.
        assert http.get("/ahead-not/x").status_code == 404
        assert http.get("/v0/health").status_code == 200
