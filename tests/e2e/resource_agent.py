"""An official-SDK agent with one registered resource, for the resources and checkpoints tests.

The resource `box` is a directory (driver `dir`): `create(ref)` makes a new one, a copy of
checkpoint `ref` when there is one; `checkpoint(handle)` copies it under a new ref; `open`
reopens a bound one. `input["steps"]` tools (`step-0`, …) each append their name to the box's
`log.txt`, declaring `resources=["box"]`, and the output is the box's log at the end, so a fork
restored from the right checkpoint ends with each step's line exactly once. Every tool body that
really runs appends one EFFECTS line.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import rebuno
import uvicorn

from tests.e2e.policy_agent import _append

AGENT_ID = os.environ["AGENT_ID"]
EFFECTS = os.environ["EFFECTS"]
ROOT = Path(os.environ["BOX_ROOT"])
KERNEL = os.environ["REBUNO_URL"]

agent = rebuno.Agent(AGENT_ID, secret=os.environ["REBUNO_AGENT_SECRET"], base_url=KERNEL)


class DirDriver:
    driver_id = "dir"
    configuration = {"root": str(ROOT)}
    coverage_reuse = False

    def create(self, checkpoint_ref: str | None) -> tuple[str, dict[str, str]]:
        path = ROOT / "live" / uuid.uuid4().hex
        if checkpoint_ref:
            shutil.copytree(ROOT / "checkpoints" / checkpoint_ref, path)
        else:
            path.mkdir(parents=True)
            (path / "log.txt").write_text("")
        return str(path), {"path": str(path)}

    def open(self, binding: dict[str, str]) -> str:
        return binding["path"]

    def checkpoint(self, handle: str) -> str:
        ref = uuid.uuid4().hex
        shutil.copytree(handle, ROOT / "checkpoints" / ref)
        return ref


def _lines(box: str) -> list[str]:
    return (Path(box) / "log.txt").read_text().split()


async def sandbox(input: Any) -> dict[str, Any]:
    ctx = rebuno.execution()
    box = await rebuno.resource("box", driver=DirDriver(), checkpoints=rebuno.CheckpointPolicy(every_steps=1))
    for i in range(int(input["steps"])):
        def body(i: int = i) -> int:
            _append(EFFECTS, f"{ctx.id} step-{i}")
            with open(Path(box) / "log.txt", "a") as f:
                f.write(f"step-{i}\n")
            return i
        await ctx.invoke_tool(f"step-{i}", {"i": i}, run=body, resources=["box"])
    return {"log": _lines(box)}


def main() -> None:
    agent.bind(sandbox)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=int(os.environ["PORT"]),
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()


if __name__ == "__main__":
    main()
