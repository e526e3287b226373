"""An official-SDK agent for the console's browser tests: the execution input lists the tool calls
to make, `{"calls": [{"tool": "shell_exec", "args": {"command": "ls"}}, ...]}`, made in order
through `ExecutionContext.invoke_tool` (a denied call is recorded and the next one is made). With
`"gate": PATH` the handler waits (bounded, 60 s) for PATH to exist before its last call, so a test
can watch a running execution's timeline."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import rebuno
import uvicorn

agent = rebuno.Agent(os.environ["AGENT_ID"], secret=os.environ["REBUNO_AGENT_SECRET"],
                     base_url=os.environ["REBUNO_URL"])


async def handle(input: dict) -> dict[str, Any]:
    ctx = rebuno.execution()
    calls = list(input.get("calls") or [])
    gate = input.get("gate")
    out: list[Any] = []
    for i, call in enumerate(calls):
        if gate and i == len(calls) - 1:
            for _ in range(1200):
                if os.path.exists(gate):
                    break
                await asyncio.sleep(0.05)
        tool, args = str(call["tool"]), dict(call.get("args") or {})
        try:
            out.append(await ctx.invoke_tool(tool, args, run=lambda tool=tool: f"ran {tool}"))
        except rebuno.PolicyError as denied:
            out.append({"denied": denied.rule_id})
    return {"results": out}


def main() -> None:
    agent.bind(handle)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
