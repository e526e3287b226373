"""An official-SDK agent for the policy end-to-end tests, configured by environment variables.

The execution input picks the tool: `{"tool": "shell_exec", "command": "ls"}` calls the tool
`shell_exec` with `{"command": "ls"}`. Every tool body appends one line to EFFECTS (so a test can
count how often a body really ran); LOG receives one JSON line per handler event.

`@rebuno.tool` wrappers turn a PolicyError into a refusal string for the LLM (rebuno/tool.py), so
the handler goes through `ExecutionContext.invoke_tool` — the call those wrappers make — to see the
PolicyError itself with its rule id. A `Blocked` (approval pending) is never caught: it unwinds the
handler and the SDK acks the dispatch; the kernel re-delivers once the approval is decided.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import rebuno
import uvicorn

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]
LOG = os.environ["LOG"]

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=os.environ["REBUNO_URL"])


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def log(event: str, **fields: Any) -> None:
    _append(LOG, json.dumps({"event": event, "pid": os.getpid(), **fields}))


def _body(tool: str, args: dict[str, Any]) -> Any:
    def run() -> str:
        _append(EFFECTS, f"{rebuno.execution().id} {tool} {json.dumps(args, sort_keys=True)}")
        return f"ran {tool}"
    return run


async def handle(input: dict) -> dict[str, Any]:
    ctx = rebuno.execution()
    args = {k: v for k, v in input.items() if k != "tool"}
    tool = str(input["tool"])
    log("calling", execution_id=ctx.id, attempt=ctx.dispatch_attempt, tool=tool)
    try:
        result = await ctx.invoke_tool(tool, args, run=_body(tool, args))
    except rebuno.PolicyError as denied:
        reason = Exception.__str__(denied)  # the bare reason; str() adds "[policy_denied] … (HTTP 403)"
        log("policy_denied", execution_id=ctx.id, tool=tool, code=denied.code, rule_id=denied.rule_id,
            reason=reason)
        return {"denied": True, "rule_id": denied.rule_id, "reason": reason}
    log("ran", execution_id=ctx.id, tool=tool, result=result)
    return {"denied": False, "result": result}


def main() -> None:
    agent.bind(handle)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
