"""The console's browser tests: Debian's Chromium driven by Playwright (never Playwright's own
browser download), one browser per session, one real kernel (SQLite, official-SDK agents on
loopback) per module.

Without a Chromium the browser tests skip with the reason; REGENT_REQUIRE_BROWSER=1 (.ci/run)
makes that a failure instead. Every page a test visits can be saved under test-output/console/.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import DEV_KERNEL_ENV, REPO, SECRET, AgentProc, Api, KernelProc, wait_for
from tests.support import free_port

CHROMIUM = os.environ.get("REGENT_CHROMIUM", "/usr/bin/chromium")
REQUIRE_BROWSER = os.environ.get("REGENT_REQUIRE_BROWSER") == "1"
SHOTS = REPO / "test-output" / "console"
CONSOLE_AGENT = Path(__file__).with_name("console_agent.py")
BOOTSTRAP_TOKEN = "console-test-bootstrap-token"

# The agents' bundle: bundles/shell.yaml's rules, with a second listed approver (`release`, whose
# key also creates executions) for the self-approval test.
BUNDLE = (REPO / "bundles" / "shell.yaml").read_text().replace("approvers: [oncall]", "approvers: [oncall, release]")


def _no_browser(reason: str) -> None:
    msg = f"browser tests need Chromium: {reason} (apt-get install -y chromium, or set REGENT_CHROMIUM)"
    if REQUIRE_BROWSER:
        pytest.fail(msg + " — mandatory because REGENT_REQUIRE_BROWSER=1")
    print(f"\n{msg}")  # the skip reason is also in the -ra summary
    pytest.skip(msg)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: Playwright's sync API leaves its event loop marked running on the main thread
    # while it is open, and any later test calling asyncio.run() would then fail.
    if not os.path.exists(CHROMIUM):
        _no_browser(f"{CHROMIUM} not found")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - the test extras pin it
        _no_browser(f"playwright is not installed ({exc})")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) per test; any dialog fails the test that opened it."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(15_000)
    pg = ctx.new_page()
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.dialogs = dialogs
    try:
        yield pg
    finally:
        ctx.close()


def shot(pg: Any, name: str, full: bool = True) -> Path:
    """A screenshot of the page (the whole of it unless `full` is False) under test-output/console/ (git-ignored)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=full)
    return path


def make_key(db_url: str, name: str, scopes: list[str]) -> str:
    """An API key written to the store before the kernel starts (one process per SQLite file);
    returns the token a visitor pastes."""
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    key_id = str(uuid.uuid4())
    token = f"rbk_{key_id}.{secrets.token_urlsafe(32)[:43]}"
    store = open_store(db_url)
    try:
        migrate(store)
        with store.transaction() as tx:
            tx.insert_api_key({"id": key_id, "name": name, "scopes": json.dumps(scopes),
                               "secret_hash": hashlib.sha256(token.encode()).digest(),
                               "created_at": datetime.now(UTC)})
    finally:
        store.close()
    return token


class ConsoleKernel:
    """A kernel process with console agents; `api` is an admin HTTP client for set-up and oracles."""

    def __init__(self, proc: KernelProc, tmp: Path, token: str | None):
        self.proc = proc
        self.url = proc.url
        self.tmp = tmp
        self.api = Api(proc.url, token)
        self.agents: list[AgentProc] = []

    def run(self, agent_id: str, calls: list[dict[str, Any]], *statuses: str, gate: str | None = None,
            timeout: float = 30) -> str:
        body: dict[str, Any] = {"calls": calls}
        if gate:
            body["gate"] = gate
        eid = self.api.create(agent_id, body)
        if statuses:
            self.api.wait_status(eid, *statuses, timeout=timeout)
        return eid

    def pending(self, eid: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            rows = self.api.http.get("/v0/approvals", params={"status": "pending"}).json()
            return next((a for a in rows if a["execution_id"] == eid), None)
        return dict(wait_for(find, f"a pending approval for {eid}", timeout=15))


@contextlib.contextmanager
def console_kernel(tmp: Path, command: str = "dev", agent_ids: tuple[str, ...] = ("ops",),
                   keys: dict[str, list[str]] | None = None, mcp: dict[str, str] | None = None,
                   **env: str) -> Iterator[tuple[ConsoleKernel, dict[str, str]]]:
    """`regent dev|serve` on a SQLite file in `tmp`, each agent on its own port with BUNDLE as its
    policy; `keys` (name → scopes) are created first and returned as name → token; `mcp` (agent →
    YAML flow mapping) is an agent's manifest `mcp:` section."""
    db_url = f"sqlite:///{tmp}/regent.db"
    tokens = {name: make_key(db_url, name, scopes) for name, scopes in (keys or {}).items()}
    ports = {a: free_port() for a in agent_ids}
    (tmp / "bundle.yaml").write_text(BUNDLE)
    lines = ["agents:"]
    for agent_id, port in ports.items():
        lines += [f"  - id: {agent_id}", f"    webhook_url: http://127.0.0.1:{port}/webhook",
                  "    secret: ${E2E_SECRET}", "    policy_file: bundle.yaml"]
        if mcp and agent_id in mcp:
            lines.append(f"    mcp: {mcp[agent_id]}")
    manifest = tmp / "regent.yaml"
    manifest.write_text("\n".join(lines) + "\n")
    extra = {"REGENT_BEARER_TOKEN": BOOTSTRAP_TOKEN} if command == "serve" else {}
    # A kernel per module, so a generous start-up bound: on a loaded machine imports alone take seconds.
    proc = KernelProc(command, free_port(), db_url, manifest, tmp / "kernel.out", ready_timeout=60.0, E2E_SECRET=SECRET,
                      **{**DEV_KERNEL_ENV, **extra, **env})
    k = ConsoleKernel(proc, tmp, BOOTSTRAP_TOKEN if command == "serve" else None)
    try:
        for agent_id, port in ports.items():
            k.agents.append(AgentProc(k.url, agent_id, port, tmp, script=CONSOLE_AGENT))
        yield k, tokens
    finally:
        for a in k.agents:
            a.stop(signal.SIGKILL)
        k.api.close()
        proc.stop_gracefully()
