"""Server processes on loopback: the bare ceiling (`python -m bench.bare`) and the kernel exactly
as deployed (`python -m kernel serve`, i.e. `regent serve`), each in its own process, one at a time.
Also the PostgreSQL scratch database the PG target runs on."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.client import percentile

ROOT = Path(__file__).resolve().parent.parent  # the repository: bench/ and kernel/ live here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Up to 90 s: on the shared 2-CPU machine under heavy load a server can take a minute to boot."""
        """Until GET /v0/health answers 200 (bounded), or the process has died."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v0/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} server did not answer /v0/health in {timeout:g}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.05)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    # The server's settings are the bench's, not whatever REGENT_* the caller's shell exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGENT_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


@contextlib.contextmanager
def serve(name: str, argv: list[str], port: int, env: dict[str, str], log_dir: Path) -> Iterator[Server]:
    """Start a server process (not waiting for it: call `wait_ready`); SIGTERM it afterwards."""
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=_clean_env(env), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", proc, log_path)
    try:
        yield server
    finally:
        server.terminate()
        server.wait_stopped()


def serve_bare(log_dir: Path) -> contextlib.AbstractContextManager[Server]:
    port = free_port()
    return serve("bare", [sys.executable, "-m", "bench.bare", "--port", str(port)], port, {}, log_dir)


def serve_kernel(name: str, db_url: str, log_dir: Path,
                 extra_env: dict[str, str] | None = None) -> contextlib.AbstractContextManager[Server]:
    """`regent serve` with its production defaults (synchronous=FULL on SQLite, dispatcher and
    sweeps running, bundle resolver, in-memory rate limiter), plus a scenario's own settings."""
    port = free_port()
    argv = [sys.executable, "-m", "kernel", "serve", "--db-url", db_url, "--host", "127.0.0.1",
            "--port", str(port)]
    env = {"REGENT_BEARER_TOKEN": "bench-" + uuid.uuid4().hex, "REGENT_SQLITE_SYNCHRONOUS": "full",
           **(extra_env or {})}
    return serve(name, argv, port, env, log_dir)


# -- PostgreSQL scratch database ---------------------------------------------------------------------

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def pg_scratch(admin_url: str, template: str | None = None) -> Iterator[str]:
    """CREATE DATABASE regent_bench_<rand> on the server of `admin_url` (a copy of `template` when
    given); DROP … WITH (FORCE) after. Raises (for the caller to turn into a skip note) when the
    server is unreachable."""
    from sqlalchemy import create_engine, text

    from kernel.store.postgres import driver_url

    name = f"regent_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(driver_url(admin_url), isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        try:
            yield admin_url.rsplit("/", 1)[0] + "/" + name
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def pg_version(url: str) -> str:
    from sqlalchemy import create_engine, text

    from kernel.store.postgres import driver_url

    eng = create_engine(driver_url(url), connect_args={"connect_timeout": 3})
    try:
        with eng.connect() as c:
            v = str(c.execute(text("SHOW server_version")).scalar())
            sc = str(c.execute(text("SHOW synchronous_commit")).scalar())
            fs = str(c.execute(text("SHOW fsync")).scalar())
        return f"PostgreSQL {v} (synchronous_commit={sc}, fsync={fs})"
    finally:
        eng.dispose()


# -- the disk's floor ------------------------------------------------------------------------------

def fsync_reference(tmp: Path, n: int) -> tuple[str, float]:
    """The disk's floor under synchronous=FULL: one-row commits on a bare sqlite3 WAL file in the
    same directory as the kernel's (a kernel round trip makes two such commits, one per request)."""
    path = tmp / "fsync-reference.db"
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        lat = []
        stop = time.perf_counter() + 5.0
        for _ in range(n):
            t = time.perf_counter()
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO t (v) VALUES (?)", ("x" * 200,))
            c.execute("COMMIT")
            lat.append(time.perf_counter() - t)
            if t > stop:
                break
    finally:
        c.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    lat.sort()
    return (f"bare sqlite3 one-row commit p50 {_ms_(percentile(lat, 0.5))} ms, p90 {_ms_(percentile(lat, 0.9))} ms, "
            f"p99 {_ms_(percentile(lat, 0.99))} ms (n={len(lat)})"), percentile(lat, 0.5)


def _ms_(x: float) -> str:
    return "–" if x != x else (f"{x * 1e3:.2f}" if x < 0.1 else f"{x * 1e3:.1f}")
