"""hello: the smallest Regent agent, written with the official Rebuno SDK.

Two tools and a durable local step. Each tool call is proposed to the kernel before it runs, and
its result is recorded; if the agent dies and the execution is re-delivered, recorded calls are
replayed instead of run again.

    regent dev                                  # in one terminal, from the repository root
    python examples/hello/agent.py              # in another: serves the webhook on :8081
    python examples/hello/agent.py --run Ada    # in a third: starts an execution and waits
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import rebuno

DEV_SECRET = "regent-dev-secret"  # the default of bundles/regent.yaml; never use it outside dev
KERNEL_URL = os.environ.get("REBUNO_URL", "http://127.0.0.1:8080")
SECRET = os.environ.get("REBUNO_AGENT_SECRET", DEV_SECRET)

GREETINGS = {"en": "Hello", "fr": "Bonjour", "de": "Hallo", "es": "Hola", "ja": "Konnichiwa"}

agent = rebuno.Agent("hello", secret=SECRET, base_url=KERNEL_URL,
                     description="Greets someone in their language.")


@rebuno.tool
async def lookup_greeting(language: str) -> str:
    return GREETINGS.get(language, GREETINGS["en"])


@rebuno.tool
async def render_greeting(greeting: str, name: str) -> str:
    return f"{greeting}, {name}!"


async def handle(name: str = "world", language: str = "en") -> dict[str, str]:
    greeting = await lookup_greeting(language)
    message = await render_greeting(greeting, name)
    # Non-deterministic work goes through a local step, so a replay sees the same value.
    stamp = await rebuno.step("greeted_at", lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return {"message": message, "greeted_at": stamp}


async def run_once(name: str, language: str) -> int:
    async with rebuno.Client(KERNEL_URL) as client:
        e = await client.create("hello", {"name": name, "language": language})
        print(f"execution {e.id}", file=sys.stderr)
        for _ in range(600):  # up to a minute
            e = await client.get(e.id)
            if e.status in ("completed", "failed", "cancelled"):
                break
            await asyncio.sleep(0.1)
        print(e.status, e.output if e.status == "completed" else e.failure_reason)
        return 0 if e.status == "completed" else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", metavar="NAME", help="start an execution for NAME and print its output")
    p.add_argument("--language", default="en")
    p.add_argument("--port", type=int, default=int(os.environ.get("HELLO_PORT", "8081")))
    args = p.parse_args()
    if args.run:
        return asyncio.run(run_once(args.run, args.language))
    agent.run(handle, host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
