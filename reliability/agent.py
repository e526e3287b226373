"""An official-SDK agent for the reliability runs: five steps per execution, the third
`at_most_once`, each tool body appending `<execution id> <step> <pid>` to the EFFECTS side file
(one O_APPEND write per line) so a run can count how often an effect really happened.

When the kernel cannot be reached (killed, restarting) the handler stops where it stands, as a
superseded lease does, and waits for the redelivery; it never fails an execution because of a
transport error. An `at_most_once` step whose earlier attempt died mid-effect comes back as an
`indeterminate` tool error: the agent records it and carries on (a real agent would look at the
system it acted on; the side file is that system here).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx2
import rebuno
import uvicorn
from rebuno.errors import APIError, LeaseSuperseded, NetworkError, ToolError

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]
STEP_DELAY = float(os.environ.get("STEP_DELAY", "0.02"))

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=os.environ["REBUNO_URL"])


def _append(line: str) -> None:
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _body(name: str) -> Any:
    def run() -> str:
        _append(f"{rebuno.execution().id} {name} {os.getpid()}")
        return f"did {name}"

    return run


async def five() -> dict[str, Any]:
    ctx = rebuno.execution()
    results: list[Any] = []
    try:
        for i in range(1, 6):
            name = f"s{i}"
            once = i == 3
            try:
                results.append(await ctx.invoke_tool(name, {"n": i}, run=_body(name),
                                                      idempotency="at_most_once" if once else "safe_to_retry"))
            except ToolError as exc:
                if not once:
                    raise
                results.append(f"indeterminate: {exc}")
            await asyncio.sleep(STEP_DELAY)
    except (httpx2.TransportError, NetworkError) as exc:
        raise LeaseSuperseded(f"kernel unreachable: {exc}", "lease_superseded", 0) from None
    except APIError as exc:
        if exc.status_code >= 500 or exc.code == "unavailable":
            raise LeaseSuperseded(f"kernel unavailable: {exc}", "lease_superseded", exc.status_code) from None
        raise
    return {"results": results}


async def one() -> dict[str, Any]:
    """A single safe step: for load runs that care about the kernel, not the agent."""
    ctx = rebuno.execution()
    try:
        return {"r": await ctx.invoke_tool("s1", {"n": 1}, run=_body("s1"))}
    except (httpx2.TransportError, NetworkError) as exc:
        raise LeaseSuperseded(f"kernel unreachable: {exc}", "lease_superseded", 0) from None


HANDLERS = {"five": five, "one": one}


def main() -> None:
    agent.bind(HANDLERS[os.environ.get("MODE", "five")])
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
