"""A supervised pool of Rego worker processes, talking length-prefixed frames over socketpairs.

Workers are plain subprocesses, not multiprocessing: `spawn` would re-import the kernel's
`__main__` in the child, and with it whatever that imports, before regopy. Each worker serves one
thread at a time; one that times out, crashes or breaks the protocol is killed and the supervisor
thread starts a replacement, backing off while replacements keep failing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from typing import IO, Any

from . import protocol as P

__all__ = ["DEFAULT_SPIN_SECONDS", "WorkerFault", "WorkerHandle", "WorkerPool", "WorkerStartError"]

log = logging.getLogger("kernel.policy.rego")

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
DEFAULT_MAX_RSS_BYTES = 512 * 1024 * 1024  # an idle worker above this is replaced
_RSS_CHECK_SECONDS = 1.0
_BACKOFF_BASE_SECONDS = 0.05
_BACKOFF_MAX_SECONDS = 2.0
_FREE_RESTARTS_PER_WORKER = 4
# How long a worker polls for the next request after a reply before it blocks (worker.py,
# Worker._await_request): waking a sleeping vCPU cost more than the evaluation on a quiet VM.
DEFAULT_SPIN_SECONDS = 200e-6


class WorkerStartError(RuntimeError):
    pass


class WorkerFault(Exception):
    """A worker stopped being usable mid-call: `kind` is timeout, crash or protocol."""

    def __init__(self, kind: str, detail: str = ""):
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}" if detail else kind)


def regopy_path() -> str:
    """The directory holding the regopy package, found without importing it."""
    spec = importlib.util.find_spec("regopy")
    if spec is None or not spec.submodule_search_locations:
        raise WorkerStartError("regopy is not installed")
    return os.path.dirname(next(iter(spec.submodule_search_locations)))


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class WorkerHandle:
    """The kernel's end of one worker process."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, stderr: IO[bytes]):
        self.proc = proc
        self.pid = proc.pid
        self.sock = sock
        self.stderr = stderr
        self.hello: dict[str, Any] = {}
        self.loaded: OrderedDict[str, None] = OrderedDict()  # bundle keys it holds (a hint)
        self.served = 0
        self.started_at = time.monotonic()
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def call(self, op: int, payload: bytes, timeout: float) -> tuple[int, bytes]:
        """One request/reply; raises WorkerFault (the caller must then discard this worker)."""
        deadline = time.monotonic() + timeout
        try:
            self.sock.sendall(P.frame(op, payload))
        except OSError as exc:
            raise WorkerFault("crash", str(exc)) from None
        return self.read_frame(deadline)

    def read_frame(self, deadline: float) -> tuple[int, bytes]:
        # The socket stays blocking and is waited on with poll(): settimeout() would cost two
        # fcntl calls per read, and poll-then-recv gave the lowest tail latency when measured.
        buf = self._buffer
        need = P.HEADER.size
        while True:
            if len(buf) >= P.HEADER.size:
                length, op = P.HEADER.unpack_from(buf)
                if length > P.MAX_FRAME_BYTES:
                    raise WorkerFault("protocol", f"frame of {length} bytes")
                need = P.HEADER.size + length
                if len(buf) >= need:
                    data = bytes(buf[P.HEADER.size : need])
                    del buf[:need]
                    return op, data
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poll.poll(max(1, math.ceil(remaining * 1000))):
                raise WorkerFault("timeout")
            try:
                chunk = self.sock.recv(max(65536, need - len(buf)))
            except OSError as exc:
                raise WorkerFault("crash", str(exc)) from None
            if not chunk:
                raise WorkerFault("crash", "connection closed")
            buf += chunk

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.sock.close()

    def exit_description(self, wait: float = 0.0) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait)
        return describe_exit(self.proc.returncode)

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - limit))
            return self.stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def close(self, grace: float = 1.0) -> None:
        with contextlib.suppress(OSError):
            # shutdown, not just close: it also wakes a thread still blocked reading this socket
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()  # the worker exits on EOF
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()

    def reap(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def start_worker(*, test_hooks: bool, start_timeout: float, nice: int = 0,
                 spin_seconds: float = DEFAULT_SPIN_SECONDS) -> WorkerHandle:
    """Start one worker and wait for its HELLO (capability probe). `nice` > 0 lowers the worker's
    CPU priority by that much (set from here right after the spawn, before it has imported regopy),
    so its start-up and evaluations yield the CPU to everything at normal priority."""
    parent, child = socket.socketpair()
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the WorkerHandle, closed on reap
    argv = [sys.executable, "-s", "-S", "-P", WORKER_SCRIPT, str(child.fileno()),
            "--spin-us", f"{max(0.0, spin_seconds) * 1e6:g}"]
    if test_hooks:
        argv.append("--test-hooks")
    try:
        # A bare environment: the worker needs only regopy on its path, and opa.runtime() would
        # otherwise show a policy every secret in the kernel's environment.
        proc = subprocess.Popen(
            argv,
            pass_fds=(child.fileno(),),
            env={"PYTHONPATH": regopy_path()},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            close_fds=True,
        )
    except OSError as exc:
        parent.close()
        stderr.close()
        raise WorkerStartError(f"cannot start a rego worker: {exc}") from exc
    finally:
        child.close()
    if nice > 0:
        with contextlib.suppress(OSError):  # gone already: the HELLO read below reports it
            os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    handle = WorkerHandle(proc, parent, stderr)
    try:
        op, payload = handle.read_frame(time.monotonic() + start_timeout)
        if op != P.OP_HELLO:
            raise WorkerFault("protocol", f"expected HELLO, got op {op}")
        handle.hello = json.loads(payload)
    except (WorkerFault, OSError, ValueError) as exc:
        handle.kill()
        reason = describe_exit(handle.proc.poll())
        tail = handle.stderr_tail()
        handle.reap()
        raise WorkerStartError(
            f"rego worker did not start ({exc or 'timeout'}; {reason})"
            + (f": {tail}" if tail else "")
        ) from None
    return handle


class WorkerPool:
    """`size` live workers, checked out one thread at a time; thread-safe."""

    def __init__(
        self,
        size: int = 2,
        *,
        start_timeout: float = 10.0,
        max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES,
        test_hooks: bool = False,
        nice: int = 0,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
    ):
        if size < 1:
            raise ValueError("a rego worker pool needs at least one worker")
        self.size = size
        self._nice = nice
        self._start_timeout = start_timeout
        self._max_rss = max_rss_bytes
        self._test_hooks = test_hooks
        self._spin_seconds = spin_seconds
        self._cond = threading.Condition()
        self._idle: list[WorkerHandle] = []
        self._live: set[WorkerHandle] = set()
        self._dead: list[WorkerHandle] = []
        self._spawning = 0
        self._closed = False
        self._consecutive_failures = 0
        self.hello: dict[str, Any] = {}
        self.workers_started = 0
        self.workers_replaced = 0
        self.start_failures = 0
        self.workers_recycled = 0
        # Start the first workers together and wait for them: a kernel that cannot run Rego at
        # all should say so at start-up, not on the first step.
        first: list[WorkerHandle] = []
        errors: list[str] = []
        threads = [
            threading.Thread(target=self._start_into, args=(first, errors)) for _ in range(size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not first:
            raise WorkerStartError("; ".join(errors) or "no rego worker started")
        for w in first:
            self._add(w)
        self._replacers: list[threading.Thread] = []
        self._supervisor = threading.Thread(
            target=self._supervise, name="rego-pool-supervisor", daemon=True
        )
        self._supervisor.start()

    def _start_into(self, out: list[WorkerHandle], errors: list[str]) -> None:
        try:
            out.append(self._start())
        except WorkerStartError as exc:
            errors.append(str(exc))

    def _start(self) -> WorkerHandle:
        w = start_worker(
            test_hooks=self._test_hooks,
            start_timeout=self._start_timeout,
            nice=self._nice,
            spin_seconds=self._spin_seconds,
        )
        self.hello = w.hello
        return w

    def _add(self, w: WorkerHandle) -> None:
        with self._cond:
            self.workers_started += 1
            self._live.add(w)
            self._idle.append(w)
            self._cond.notify_all()

    # -- checkout ----------------------------------------------------------------------------
    def acquire(self, timeout: float) -> WorkerHandle | None:
        """An idle worker, or None if none frees up within `timeout` (or the pool is closed)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._idle:
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._idle.pop()  # LIFO: the warmest worker, with the most bundles cached

    def release(self, w: WorkerHandle) -> None:
        """Give back a worker that answered normally."""
        w.served += 1
        with self._cond:
            self._consecutive_failures = 0
            if self._closed or w not in self._live:
                return
            self._idle.append(w)
            self._cond.notify()

    def discard(self, w: WorkerHandle, fault: WorkerFault) -> tuple[str, str]:
        """Kill a faulted worker and have it replaced; returns how it ended and the end of its
        stderr (rego-cpp's own last words on an abort), for reasons and logs."""
        if fault.kind == "crash":
            how = w.exit_description(wait=0.1)  # it is dying already: learn the signal
            w.kill()
        else:
            w.kill()
            how = (
                "killed after a timeout" if fault.kind == "timeout" else f"killed ({fault.detail})"
            )
        tail = w.stderr_tail(500) if fault.kind != "timeout" else ""  # before the reaper closes it
        with self._cond:
            self._consecutive_failures += 1
            self._live.discard(w)
            self._dead.append(w)
            self._cond.notify_all()
        return how, tail

    # -- supervision -------------------------------------------------------------------------
    def _backoff(self) -> float:
        """Delay before the next replacement: none for the first few faults in a row (a bad step
        costs one worker, and the next step must find a fresh one), then doubling, so a bundle
        or machine that kills every worker cannot turn the supervisor into a fork loop."""
        excess = self._consecutive_failures - _FREE_RESTARTS_PER_WORKER * self.size
        if excess <= 0:
            return 0.0
        return min(_BACKOFF_BASE_SECONDS * 2 ** (excess - 1), _BACKOFF_MAX_SECONDS)

    def _supervise(self) -> None:
        while True:
            with self._cond:
                next_check = time.monotonic() + _RSS_CHECK_SECONDS
                while (
                    not self._closed
                    and not self._dead
                    and len(self._live) + self._spawning >= self.size
                ):
                    remaining = next_check - time.monotonic()
                    if remaining <= 0:
                        self._recycle_bloated()
                        next_check = time.monotonic() + _RSS_CHECK_SECONDS
                        continue
                    self._cond.wait(remaining)
                dead, self._dead = self._dead, []
                if self._closed:
                    break
                delays = []
                while len(self._live) + self._spawning < self.size:
                    self._spawning += 1
                    delays.append(self._backoff())
            for gone in dead:
                gone.reap()
            for delay in delays:
                # One thread per replacement: starting a worker takes ~0.1 s, and when several
                # die at once the last should not wait for all the others.
                t = threading.Thread(
                    target=self._replace, args=(delay,), name="rego-pool-replace", daemon=True
                )
                self._replacers = [r for r in self._replacers if r.is_alive()] + [t]
                t.start()
        for gone in dead:
            gone.reap()

    def _replace(self, delay: float) -> None:
        if delay:
            with self._cond:
                self._cond.wait_for(lambda: self._closed, timeout=delay)
        w: WorkerHandle | None = None
        if not self._closed:
            try:
                w = self._start()
            except WorkerStartError as exc:
                log.error("rego worker replacement failed: %s", exc)
                with self._cond:
                    self.start_failures += 1
                    self._consecutive_failures += 1
        with self._cond:
            self._spawning -= 1
            closed = self._closed
            if w is not None and not closed:
                self.workers_replaced += 1
                self.workers_started += 1
                self._live.add(w)
                self._idle.append(w)
            self._cond.notify_all()
        if w is not None and closed:
            w.close()

    def _recycle_bloated(self) -> None:
        """Retire idle workers whose resident memory passed the limit (caller holds the lock).

        rego-cpp cannot be bounded with rlimits (see worker.main), so a slow leak or one huge
        bundle is caught here instead."""
        for w in list(self._idle):
            rss = rss_bytes(w.pid)
            if rss > self._max_rss:
                log.warning(
                    "rego worker %d uses %d MiB (limit %d MiB): replacing it",
                    w.pid,
                    rss >> 20,
                    self._max_rss >> 20,
                )
                self._idle.remove(w)
                self._live.discard(w)
                w.kill()
                self._dead.append(w)
                self.workers_recycled += 1

    # -- inspection and shutdown -------------------------------------------------------------
    def pids(self) -> list[int]:
        with self._cond:
            return sorted(w.pid for w in self._live)

    def live_count(self) -> int:
        with self._cond:
            return len(self._live)

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Block until `size` workers are live (tests; start-up)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: len(self._live) >= self.size or self._closed, timeout
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            workers = list(self._live)
            self._live.clear()
            self._idle.clear()
            self._cond.notify_all()
        self._supervisor.join(timeout=10)
        for t in self._replacers:
            t.join(timeout=10)
        for w in workers:
            w.close()
