"""An official-SDK agent for the rate-limit end-to-end tests.

The execution input is `{"calls": [{"tool": "search", "n": 1}, ...]}`: the handler calls each tool in
order through `ExecutionContext.invoke_tool` (so a `RateLimited` reaches it unwrapped), appends one
EFFECTS line per tool body that really ran, and logs one JSON line per handler event to LOG. A
`RateLimited` is caught and returned as the output (or skipped with `"keep_going": true`); a `Blocked` (parked) is not caught: it unwinds the
handler, the SDK acks the dispatch, and the kernel re-delivers after the wait.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import rebuno
import uvicorn

from tests.e2e.policy_agent import _append, log  # same EFFECTS/LOG formats

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=os.environ["REBUNO_URL"])


def _body(tool: str, n: Any) -> Any:
    def run() -> str:
        _append(EFFECTS, f"{rebuno.execution().id} {tool} {n} {time.time():.3f}")
        return f"ran {tool} {n}"
    return run


async def handle(input: dict) -> dict[str, Any]:
    ctx = rebuno.execution()
    log("delivered", execution_id=ctx.id, attempt=ctx.dispatch_attempt, at=time.time())
    results = []
    for call in input["calls"]:
        tool, n = str(call["tool"]), call["n"]
        try:
            results.append(await ctx.invoke_tool(tool, {"n": n}, run=_body(tool, n)))
        except rebuno.RateLimited as refused:
            log("rate_limited", execution_id=ctx.id, tool=tool, n=n, type=type(refused).__name__,
                reason=Exception.__str__(refused))
            if input.get("keep_going"):
                continue
            return {"rate_limited": True, "at": n, "reason": Exception.__str__(refused), "results": results}
        except rebuno.Blocked:
            log("blocked", execution_id=ctx.id, tool=tool, n=n, at=time.time())
            raise
    return {"rate_limited": False, "results": results}


def main() -> None:
    agent.bind(handle)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
