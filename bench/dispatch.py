"""The `dispatch` scenario: webhook deliveries against creates, side by side in one run.

Its own servers: a webhook agent on loopback that answers 200 at once (`python -m bench.dispatch
PORT`, a bare asyncio HTTP/1.1 server that only notes when each delivery arrived) and `regent
serve` on a temp SQLite file with that agent registered. `clients` threads create executions as
fast as the kernel accepts them for a fixed time; the figure is the deliveries the agent received
in that same interval over the creates the kernel acknowledged in it (goal ≥ 80 %, issue 18 §0),
then how long the backlog took to drain after the creates stopped. A second agent is present
throughout, as a hostile neighbour: its webhook accepts TCP and never answers (a black hole), and
200 executions are queued for it before the flood starts (issue 30 §1, issue 33 §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.client import BenchError
from bench.scenarios import LocalScenario, Profile, Result
from bench.servers import ROOT, free_port, serve_kernel

CLIENTS = 50
AGENT_ID = "bench-dispatch-agent"
SECRET = "bench-dispatch-secret"
BLACK_HOLE_AGENT = "bench-black-hole"
BLACK_HOLE_EXECUTIONS = 200


# -- the webhook agent (a child process) ---------------------------------------------------------

class _Receiver(asyncio.Protocol):
    arrivals: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(rest) < length:
                return
            self.buf = rest[length:]
            if head.startswith(b"GET /arrivals"):
                body = json.dumps(self.arrivals).encode()
            else:
                self.arrivals.append(time.time())
                body = b""
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "  # type: ignore[attr-defined]
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)


def receiver_main(port: int) -> None:
    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_Receiver, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


@contextlib.contextmanager
def _receiver() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.dispatch", str(port)], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/arrivals", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise BenchError("the webhook agent did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A webhook that accepts every TCP connection and never answers, until the block ends."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1024)
    lsock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set() and len(held) < 10_000:
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    th = threading.Thread(target=accept, name="bench-black-hole", daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}/webhook"
    finally:
        stop.set()
        th.join(timeout=5)
        for c in [*held, lsock]:
            c.close()


def _arrivals(url: str) -> list[float]:
    return [float(t) for t in httpx.get(f"{url}/arrivals", timeout=10).json()]


# -- the measurement --------------------------------------------------------------------------------

def _prepare(db_url: str, webhook: str, black_hole_webhook: str | None = None) -> None:
    from kernel.core.agents import register_agent
    from kernel.core.executions import create_execution
    from kernel.core.kernel import Kernel
    from kernel.store import open_store
    from kernel.store.migrations import migrate

    store = open_store(db_url)
    try:
        migrate(store)
        k = Kernel(store=store)
        register_agent(k, AGENT_ID, webhook, SECRET, 3600, keep_policy=True)
        if black_hole_webhook:
            register_agent(k, BLACK_HOLE_AGENT, black_hole_webhook, SECRET, 3600, keep_policy=True)
            for i in range(BLACK_HOLE_EXECUTIONS):
                create_execution(k, BLACK_HOLE_AGENT, {"n": i})
    finally:
        store.close()


def _create_loop(url: str, token: str, stop: threading.Event, acked: list[float], refused: list[int]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        while not stop.is_set():
            r = http.post("/v0/executions", json={"agent_id": AGENT_ID, "input": {"n": len(acked)}})
            if r.status_code == 201:
                acked.append(time.time())
            elif r.status_code in (429, 503):
                refused.append(r.status_code)
                time.sleep(float(r.headers.get("Retry-After", "1")))
            else:
                raise BenchError(f"create answered {r.status_code}: {r.text[:200]}")


def measure(seconds: float, clients: int = CLIENTS, extra_env: dict[str, str] | None = None,
            keep: bool = False, db_url: str | None = None, with_black_hole: bool = True) -> dict[str, float]:
    """`keep` leaves the temp dir (the server's log) in place; `with_black_hole` adds the agent whose
    webhook never answers, with its executions queued."""
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-dispatch-"))
    try:
        with _receiver() as agent_url, black_hole() as hole:
            db = db_url or f"sqlite:///{tmp}/dispatch-bench.db"
            _prepare(db, f"{agent_url}/webhook", hole if with_black_hole else None)
            bearer = "bench-dispatch-" + uuid.uuid4().hex
            env = {"REGENT_BEARER_TOKEN": bearer, "REGENT_MAX_BACKLOG": "0", **(extra_env or {})}
            with serve_kernel("sqlite-dispatch", db, tmp, extra_env=env) as srv:
                srv.wait_ready()
                stop = threading.Event()
                acked: list[float] = []
                refused: list[int] = []
                threads = [threading.Thread(target=_create_loop, args=(srv.url, bearer, stop, acked, refused),
                                            daemon=True) for _ in range(clients)]
                for th in threads:
                    th.start()
                time.sleep(1.0)  # warm-up: connections open, the queue is flowing
                t0 = time.time()
                n0, d0 = len(acked), len(_arrivals(agent_url))
                time.sleep(seconds)
                t1 = time.time()
                n1, d1 = len(acked), len(_arrivals(agent_url))
                stop.set()
                for th in threads:
                    th.join(timeout=60)
                total = len(acked)
                drain_deadline = time.monotonic() + 120
                while len(_arrivals(agent_url)) < total and time.monotonic() < drain_deadline:
                    time.sleep(0.1)
                drained = time.time() - t1
                delivered = len(_arrivals(agent_url))
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    span = t1 - t0
    return {"creates_per_s": (n1 - n0) / span, "deliveries_per_s": (d1 - d0) / span, "seconds": span,
            "created": float(total), "delivered": float(delivered), "drain_s": drained,
            "refused": float(len(refused))}


def _run(p: Profile) -> list[Result]:
    seconds = 5.0 if p.name == "quick" else 20.0
    m = measure(seconds)
    ratio = m["deliveries_per_s"] / m["creates_per_s"] if m["creates_per_s"] else float("nan")
    name = "dispatch: webhook deliveries vs creates"
    stats = {"ops": int(m["created"]), "workers": CLIENTS, "throughput": m["creates_per_s"]}
    return [Result(name, f"sqlite, {CLIENTS} clients creating, a black-hole agent with {BLACK_HOLE_EXECUTIONS} queued",
                   op="create", stats=stats,
                   extra={k: round(v, 2) for k, v in m.items()},
                   figures=[
                       ("dispatch: deliveries/s ÷ creates/s, same interval",
                        f"{ratio:.0%} ({m['deliveries_per_s']:.0f}/s of {m['creates_per_s']:.0f}/s)", "≥ 80 %"),
                       ("dispatch: backlog drained after creates stopped",
                        f"{m['drain_s']:.1f} s ({int(m['delivered'])}/{int(m['created'])} delivered)", "–"),
                   ])]


DISPATCH = LocalScenario("dispatch", "dispatch", _run,
                         "webhook deliveries/s to a loopback agent vs creates/s, one run (own servers)")


if __name__ == "__main__":
    receiver_main(int(sys.argv[1]))
