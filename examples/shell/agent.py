"""shell: an agent that runs one command per execution, governed by bundles/shell.yaml.

The command is a tool call (`shell_exec`, `at_most_once`): the kernel decides on every call —
read-only commands run, anything else waits for a human approval — and a call whose outcome was
lost in a crash is never run a second time. The command is run without a shell (no pipes, no
expansion), with a timeout, in the agent's working directory.

    regent dev                                  # from the repository root
    python examples/shell/agent.py              # serves the webhook on :8082
    python examples/shell/agent.py --run "ls -la"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from typing import Any

import rebuno

DEV_SECRET = "regent-dev-secret"  # the default of bundles/regent.yaml; never use it outside dev
KERNEL_URL = os.environ.get("REBUNO_URL", "http://127.0.0.1:8080")
SECRET = os.environ.get("REBUNO_AGENT_SECRET", DEV_SECRET)
TIMEOUT_SECONDS = 30
MAX_OUTPUT = 16_000

agent = rebuno.Agent("shell", secret=SECRET, base_url=KERNEL_URL,
                     description="Runs one command, as its policy allows.")


@rebuno.tool("shell_exec", idempotency="at_most_once")
async def shell_exec(command: str) -> dict[str, Any]:
    argv = shlex.split(command)
    if not argv:
        return {"exit_code": 2, "stdout": "", "stderr": "empty command"}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return {"exit_code": 127, "stdout": "", "stderr": str(exc)}
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=TIMEOUT_SECONDS)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"exit_code": -9, "stdout": "", "stderr": f"timed out after {TIMEOUT_SECONDS}s"}
    return {
        "exit_code": proc.returncode,
        "stdout": out.decode("utf-8", "replace")[-MAX_OUTPUT:],
        "stderr": err.decode("utf-8", "replace")[-MAX_OUTPUT:],
    }


async def handle(command: str) -> dict[str, Any]:
    # A denied call comes back as a refusal string from the SDK's @tool wrapper.
    return {"command": command, "result": await shell_exec(command)}


async def run_once(command: str) -> int:
    async with rebuno.Client(KERNEL_URL) as client:
        e = await client.create("shell", {"command": command})
        print(f"execution {e.id}", file=sys.stderr)
        told = False
        for _ in range(3000):  # up to five minutes (an approval may be pending)
            e = await client.get(e.id)
            if e.status in ("completed", "failed", "cancelled"):
                break
            if e.status == "blocked" and not told:
                print("waiting for an approval: GET /v0/approvals?status=pending", file=sys.stderr)
                told = True
            await asyncio.sleep(0.1)
        print(e.status, e.output if e.status == "completed" else e.failure_reason)
        return 0 if e.status == "completed" else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", metavar="COMMAND", help="start an execution running COMMAND and print its output")
    p.add_argument("--port", type=int, default=int(os.environ.get("SHELL_PORT", "8082")))
    args = p.parse_args()
    if args.run:
        return asyncio.run(run_once(args.run))
    agent.run(handle, host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
