"""Real processes on loopback: `regent dev|serve` kernels and official-SDK agents.

Every wait is bounded; every process is stopped by its own pid. A kernel is stopped with SIGTERM
and must exit 0 (graceful shutdown), which every test using one checks on the way out.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]
AGENT_APP = Path(__file__).with_name("agent_app.py")
SECRET = "e2e-secret"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REGENT_", "REBUNO_"))}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


class Proc:
    """A child process with its output in a file (shown when a wait fails)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO):
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._out.close()
        return self.p.returncode


class KernelProc(Proc):
    def __init__(self, command: str, port: int, db_url: str, manifest: Path | None, log: Path,
                 ready_timeout: float = 60.0, **env: str):
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "kernel", command, "--port", str(port), "--db-url", db_url]
        argv += ["--config", str(manifest)] if manifest is not None else []
        super().__init__(argv, clean_env(**env), log)
        wait_for(self._healthy, f"regent {command} on {self.url}\n{self.output()}", timeout=ready_timeout)

    def _healthy(self) -> bool:
        if not self.alive():
            raise AssertionError(f"regent exited early:\n{self.output()}")
        try:
            return httpx.get(f"{self.url}/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop_gracefully(self, sig: int = signal.SIGTERM) -> None:
        rc = self.stop(sig)
        out = self.output()
        assert rc == 0, f"regent exited {rc} on {signal.Signals(sig).name}:\n{out}"
        assert "regent: stopped" in out
        assert "Traceback" not in out, out


class AgentProc(Proc):
    """tests/e2e/agent_app.py (or an example) serving its webhook on `port`."""

    def __init__(self, kernel_url: str, agent_id: str, port: int, tmp: Path, *, script: Path = AGENT_APP,
                 secret: str = SECRET, argv: list[str] | None = None, **env: str):
        self.port = port
        self.effects = tmp / f"{agent_id}.effects"
        self.events = tmp / f"{agent_id}.log"
        full_env = clean_env(REBUNO_URL=kernel_url, REBUNO_AGENT_SECRET=secret, AGENT_ID=agent_id, PORT=str(port),
                             EFFECTS=str(self.effects), LOG=str(self.events), **env)
        super().__init__([sys.executable, str(script), *(argv or [])], full_env, tmp / f"{agent_id}.{port}.out")
        wait_for(self._up, f"agent {agent_id} on port {port}\n{self.output()}", timeout=60)

    def _up(self) -> bool:
        if not self.alive():
            raise AssertionError(f"agent exited early:\n{self.output()}")
        try:
            httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    def effect_lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def log_lines(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        rows = [json.loads(line) for line in self.events.read_text().splitlines() if line]
        return [r for r in rows if event is None or r["event"] == event]


def sign_webhook(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Api:
    """A small client for the kernel's client routes (the tests' own oracle, not the SDK)."""

    def __init__(self, url: str, token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, timeout=15, headers=headers)

    def create(self, agent_id: str, input: Any = None) -> str:
        r = self.http.post("/v0/executions", json={"agent_id": agent_id, "input": input})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def get(self, eid: str) -> dict[str, Any]:
        r = self.http.get(f"/v0/executions/{eid}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def events(self, eid: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v0/executions/{eid}/events", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return list(r.json())

    def types(self, eid: str) -> list[str]:
        return [e["type"] for e in self.events(eid)]

    def steps(self, eid: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v0/executions/{eid}/steps")
        assert r.status_code == 200, r.text
        return list(r.json())

    def wait_status(self, eid: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        return dict(wait_for(lambda: (e := self.get(eid))["status"] in statuses and e,
                             f"execution {eid} to reach {statuses}", timeout))

    def close(self) -> None:
        self.http.close()


# Settings shared by the dev kernel of the SDK scenarios: a short kernel lease so re-delivery
# after a kill takes seconds, and short backoff. Attempts are generous: on a loaded machine a
# restarted agent can take seconds to listen, and each refused delivery meanwhile is an attempt.
DEV_KERNEL_ENV = {
    "REGENT_DISPATCH_LEASE_TIMEOUT": "5s",
    "REGENT_DISPATCH_MAX_ATTEMPTS": "10",
    "REGENT_DISPATCH_BASE_DELAY": "100ms",
    "REGENT_DISPATCH_MAX_DELAY": "1s",
    "REGENT_DISPATCH_POLL_INTERVAL": "50ms",
    "REGENT_DISPATCH_TIMEOUT": "5s",
    "REGENT_LOG_LEVEL": "info",
}
AGENTS = ("hello", "shell", "crash", "llm", "ticks", "gated")


class DevKernel:
    def __init__(self, proc: KernelProc, ports: dict[str, int], tmp: Path):
        self.proc = proc
        self.url = proc.url
        self.ports = ports
        self.tmp = tmp
        self.api = Api(proc.url)
        self.agents: list[AgentProc] = []

    def agent(self, agent_id: str, **kw: Any) -> AgentProc:
        a = AgentProc(self.url, agent_id, self.ports[agent_id], self.tmp, **kw)
        self.agents.append(a)
        return a


@pytest.fixture(scope="module")
def dev_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevKernel]:
    """One `regent dev` on a SQLite file for the SDK scenarios; one agent id (and port) each."""
    tmp = tmp_path_factory.mktemp("dev")
    with dev_kernel_for(AGENTS, tmp) as k:
        yield k


@contextlib.contextmanager
def dev_kernel_for(agent_ids: tuple[str, ...], tmp: Path, db_url: str | None = None, **env: str) -> Iterator[DevKernel]:
    """A `regent dev` on a SQLite file in `tmp` (or `db_url`), provisioned with `agent_ids` on free ports."""
    ports = {a: free_port() for a in agent_ids}
    lines = ["agents:"]
    for agent_id, port in ports.items():
        lines += [f"  - id: {agent_id}", f"    webhook_url: http://127.0.0.1:{port}/webhook",
                  "    secret: ${E2E_SECRET}"]
    manifest = tmp / "regent.yaml"
    manifest.write_text("\n".join(lines) + "\n")
    proc = KernelProc("dev", free_port(), db_url or f"sqlite:///{tmp}/regent.db", manifest, tmp / "kernel.out",
                      E2E_SECRET=SECRET, **{**DEV_KERNEL_ENV, **env})
    k = DevKernel(proc, ports, tmp)
    try:
        yield k
    finally:
        for a in k.agents:
            a.stop(signal.SIGKILL)
        k.api.close()
        proc.stop_gracefully()
