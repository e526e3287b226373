"""An official-SDK agent for the session, sub-agent and fork end-to-end tests (MODE picks it).

- `chat`: one turn of a conversation. Reads `rebuno.previous()`, appends the input to the history
  and returns `Result(output=…, state={"history": …})`.
- `orchestrator`: runs `input["children"]` sub-agents at once (SDK `subagent()`, three tool calls
  gathered), each a child execution of `input["child_agent"]` (in `input["child_session"]` when
  given); the execution suspends while they run and its rerun replays their outputs.
- `child`: returns `{"echo": input}` after `input.get("sleep", 0)` seconds (a `sleep` of -1 waits
  until cancelled).
- `steps`: runs `input["steps"]` tools in order (`step-0`, `step-1`, …), catching policy denials;
  the indexes in `input["at_most_once"]` are declared `at_most_once`.

Every tool body that really runs appends one EFFECTS line, so a test can count re-runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import rebuno
import uvicorn

from tests.e2e.policy_agent import _append, log

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]
MODE = os.environ["MODE"]
KERNEL = os.environ["REBUNO_URL"]

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=KERNEL)


async def chat(input: Any) -> rebuno.Result:
    prev = await rebuno.previous()
    history = list(prev["history"]) if isinstance(prev, dict) else []
    log("turn", execution_id=rebuno.execution().id, previous=prev)
    history.append(input)
    return rebuno.Result(output={"turn": len(history), "seen": history[:-1]}, state={"history": history})


def _spawner(i: int, child_agent: str, child_input: Any, session: str = "") -> Any:
    async def spawn() -> Any:
        _append(EFFECTS, f"{rebuno.execution().id} spawn-{i}")
        async with rebuno.Client(base_url=KERNEL) as client:
            return await rebuno.subagent(child_agent, child_input, session=session, client=client)

    return spawn


async def orchestrator(input: Any) -> dict[str, Any]:
    ctx = rebuno.execution()
    log("orchestrator", execution_id=ctx.id, attempt=ctx.dispatch_attempt)
    calls = [
        ctx.invoke_tool(f"spawn-{i}", {"i": i}, run=_spawner(i, input["child_agent"], {"i": i, **input.get("child", {})},
                                                             input.get("child_session", "")))
        for i in range(int(input["children"]))
    ]
    results = await asyncio.gather(*calls)
    return {"children": list(results)}


async def child(input: Any) -> dict[str, Any]:
    log("child", execution_id=rebuno.execution().id)
    wait = float(input.get("sleep", 0)) if isinstance(input, dict) else 0.0
    if wait < 0:
        await asyncio.Event().wait()
    await asyncio.sleep(wait)
    return {"echo": input}


async def steps(input: Any) -> dict[str, Any]:
    ctx = rebuno.execution()
    out: list[Any] = []
    once = set(input.get("at_most_once", ()))
    for i in range(int(input["steps"])):
        def body(i: int = i) -> str:
            _append(EFFECTS, f"{ctx.id} step-{i}")
            return f"did {i}"
        try:
            out.append(await ctx.invoke_tool(f"step-{i}", {"i": i}, run=body,
                                             idempotency="at_most_once" if i in once else "safe_to_retry"))
        except rebuno.PolicyError as denied:
            out.append({"denied": denied.rule_id})
    return {"results": out}


def main() -> None:
    agent.bind({"chat": chat, "orchestrator": orchestrator, "child": child, "steps": steps}[MODE])
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
