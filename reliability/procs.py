"""The real processes a scenario runs, each on loopback and stopped by its own pid: `regent serve`,
official-SDK agents (reliability/agent.py), and private PostgreSQL and Redis servers in a temp dir
on ports of their own (the shared ones on 5432/6379 are never stopped or reconfigured)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
AGENT_SCRIPT = Path(__file__).with_name("agent.py")
TOKEN = "chaos-bootstrap-token"
SECRET = "chaos-agent-secret"

# Short leases and backoff, so a redelivery after a kill takes seconds; generous attempts, since
# every delivery refused while an agent or the kernel restarts is one.
FAST_DISPATCH = {
    "REGENT_DISPATCH_LEASE_TIMEOUT": "3s",
    "REGENT_DISPATCH_MAX_ATTEMPTS": "1000",
    "REGENT_DISPATCH_BASE_DELAY": "100ms",
    "REGENT_DISPATCH_MAX_DELAY": "1s",
    "REGENT_DISPATCH_POLL_INTERVAL": "50ms",
    "REGENT_DISPATCH_TIMEOUT": "5s",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_receiver(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int, threading.Thread]:
    """A loopback HTTP server for `handler` on a free port, each request on a daemon thread; returns
    the server, its port and the (not yet started) thread that serves it."""
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server, port, threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REGENT_", "REBUNO_"))}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def write_manifest(path: Path, agents: dict[str, int], *, policy: dict[str, str] | None = None) -> Path:
    """A provisioning manifest: each agent id → its webhook port, all with SECRET; `policy` names a
    YAML bundle file per agent."""
    lines = ["agents:"]
    for agent_id, port in agents.items():
        lines += [f"  - id: {agent_id}", f"    webhook_url: http://127.0.0.1:{port}/webhook",
                  f"    secret: {SECRET}"]
        if policy and agent_id in policy:
            lines.append(f"    policy_file: {policy[agent_id]}")
    path.write_text("\n".join(lines) + "\n")
    return path


class Kernel:
    """`regent serve` on a fixed loopback port (so agents find it again after a restart)."""

    def __init__(self, db_url: str, log: Path, *, manifest: Path | None = None, port: int | None = None,
                 **env: str):
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.manifest = manifest
        self.env = clean_env(REGENT_BEARER_TOKEN=TOKEN, REGENT_LOG_LEVEL="warning", **env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> Kernel:
        argv = [sys.executable, "-m", "kernel", "serve", "--db-url", self.db_url, "--host", "127.0.0.1",
                "--port", str(self.port)]
        if self.manifest is not None:
            argv += ["--config", str(self.manifest)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.starts += 1
        wait_for(self.healthy, f"regent serve on {self.url}:\n{self.tail()}", timeout)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"regent serve exited ({self.proc and self.proc.returncode}):\n{self.tail()}")
        try:
            return httpx.get(self.url + "/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush."""
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def stop(self) -> int | None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc is not None else None

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


class Agent:
    """reliability/agent.py: an official-SDK agent serving its webhook on `port`."""

    def __init__(self, kernel_url: str, agent_id: str, port: int, tmp: Path, *, mode: str = "five",
                 effects: Path | None = None, **env: str):
        self.port = port
        self.effects = effects or tmp / f"{agent_id}.effects"
        self.out = tmp / f"{agent_id}.{port}.out"
        full = clean_env(REBUNO_URL=kernel_url, REBUNO_AGENT_SECRET=SECRET, AGENT_ID=agent_id, PORT=str(port),
                         EFFECTS=str(self.effects), MODE=mode, **env)
        with self.out.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, str(AGENT_SCRIPT)], env=full, cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._up, f"agent {agent_id} on {port}", 30)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent exited:\n{self.out.read_text(errors='replace')[-2000:]}")
        try:
            httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def effect_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line] if path.exists() else []


# -- a private PostgreSQL ------------------------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / name).exists():
            return str(base / name)
    raise FileNotFoundError(f"{name} (PostgreSQL server binaries) not found")


class PrivatePostgres:
    """initdb + pg_ctl in a temp dir on its own port, run as the `postgres` user when we are root
    (the server refuses root). Only this instance is ever restarted."""

    def __init__(self, tmp: Path):
        self.dir = tmp / "pgdata"
        self.sock = tmp / "pgsock"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self._tmp = tmp

    def _run(self, *argv: str, timeout: float = 60) -> None:
        subprocess.run([*self._as, *argv], check=True, timeout=timeout, stdout=subprocess.DEVNULL,
                       stderr=subprocess.STDOUT, cwd="/")

    def start(self) -> PrivatePostgres:
        self.sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            # The server runs as postgres: it must reach its directory through ours (mkdtemp makes 0700).
            for parent in self._tmp.parents:
                if parent == Path("/") or parent.stat().st_uid != 0:
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
            shutil.chown(self._tmp, "postgres")
            shutil.chown(self.sock, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.dir), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with (self.dir / "postgresql.conf").open("a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.sock}'\n"
                    "fsync = on\nmax_connections = 100\n")
        self._ctl("start")
        return self

    def _ctl(self, action: str, *extra: str) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.dir), "-l", str(self._tmp / "pg.log"), "-w", "-t", "60",
                  action, *extra)

    def restart(self) -> None:
        self._ctl("restart", "-m", "immediate")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._ctl("stop", "-m", "immediate")


class PrivateRedis:
    def __init__(self, tmp: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
            return False

        wait_for(up, f"redis-server on {self.port}", 15)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def scratch_database(admin_url: str, prefix: str = "regent_chaos") -> Iterator[str]:
    """A fresh database on the server of `admin_url`, dropped afterwards."""
    import uuid

    from sqlalchemy import create_engine, text

    from kernel.store.postgres import driver_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(driver_url(admin_url), isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield admin_url.rsplit("/", 1)[0] + "/" + name
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
