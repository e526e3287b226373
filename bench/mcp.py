"""The `mcp` scenario: what the MCP gateway adds to a tool call, side by side in one run.

Per backend (SQLite, and PostgreSQL when reachable) and per mode, its own servers: `regent serve`
with two agents, an upstream MCP server on streamable HTTP (`python -m bench.mcp upstream PORT`,
one `echo` tool), the gateway in front of it — `regent mcp serve` beside the kernel, then the
kernel's own `--mcp` gateway — and a webhook receiver in this process that keeps the plain agent's
lease. Interleaved, one at a time: a tools/call through the gateway, the same call made directly
to the upstream, and a plain step round trip (signed submit → proceed → signed complete).
Goal (issue 31): gateway − direct ≤ 1.2 × the plain round trip, at p50.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.client import Agent, Lease, percentile, proc_cpu, round_trip
from bench.scenarios import LocalScenario, Profile, Result
from bench.servers import DEFAULT_PG_URL, ROOT, free_port, pg_scratch, serve

GOAL = 1.2
SECRET = "bench-mcp-secret-0123456789"


def upstream_main(port: int) -> None:
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("bench-echo", host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool(description="Echo n back.")
    def echo(n: int) -> dict[str, Any]:
        return {"ok": True, "echo": n}

    server.run("streamable-http")


class _Receiver(http.server.BaseHTTPRequestHandler):
    leases: dict[str, Lease] = {}
    got = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        _Receiver.leases[body["execution_id"]] = Lease(body["execution_id"], body["dispatch_id"],
                                                       int(body["dispatch_attempt"]))
        _Receiver.got.set()
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _receiver() -> Iterator[int]:
    port = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield port
    finally:
        srv.shutdown()
        srv.server_close()


def _wait(url: str, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up at {url} in {timeout:g}s")


async def _measure(gateway_url: str, upstream_url: str, plain: Agent, lease: Lease, n: int, seconds: float,
                   warmup: int) -> dict[str, list[float]]:
    import logging

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    logging.getLogger("mcp").setLevel(logging.WARNING)  # the SDK's client logs each session at INFO

    out: dict[str, list[float]] = {"gateway": [], "direct": [], "plain": []}
    async with contextlib.AsyncExitStack() as stack:
        sessions = {}
        for name, url in (("gateway", gateway_url), ("direct", upstream_url)):
            read, write, _ = await stack.enter_async_context(streamable_http_client(url))
            s = await stack.enter_async_context(ClientSession(read, write))
            await s.initialize()
            sessions[name] = s
        for i in range(warmup):  # the first gateway call also waits for the session's first delivery
            for s in sessions.values():
                r = await s.call_tool("bench_echo" if s is sessions["gateway"] else "echo", {"n": -i - 1})
                if r.isError:
                    raise RuntimeError(f"warm-up call failed: {r.content}")
            round_trip(plain, lease, 10_000_000 + i)
        deadline = time.monotonic() + seconds
        for i in range(n):
            if time.monotonic() > deadline:
                break
            t0 = time.perf_counter()
            r = await sessions["gateway"].call_tool("bench_echo", {"n": i})
            t1 = time.perf_counter()
            d = await sessions["direct"].call_tool("echo", {"n": i})
            t2 = time.perf_counter()
            round_trip(plain, lease, i)
            t3 = time.perf_counter()
            if r.isError or d.isError:
                raise RuntimeError(f"call {i} failed: {r.content if r.isError else d.content}")
            out["gateway"].append(t1 - t0)
            out["direct"].append(t2 - t1)
            out["plain"].append(t3 - t2)
    return out


def measure(db_url: str, tmp: Path, n: int, seconds: float, warmup: int,
            in_kernel: bool = False) -> dict[str, list[float]]:
    """One backend, one mode: `regent mcp serve` beside the kernel, or (`in_kernel`) the gateway
    served by the kernel's own process (`regent serve --mcp`)."""
    kernel_port, gw_port, up_port = free_port(), free_port(), free_port()
    token = "bench-" + uuid.uuid4().hex
    gw_base = f"http://127.0.0.1:{kernel_port}/mcp-gateway" if in_kernel else f"http://127.0.0.1:{gw_port}"
    with _receiver() as recv_port, contextlib.ExitStack() as stack:
        manifest = tmp / f"mcp-{uuid.uuid4().hex[:6]}.yaml"
        manifest.write_text(f"""\
agents:
  - id: bench-mcp
    webhook_url: {gw_base}/webhooks/bench-mcp
    secret: {SECRET}
    mcp:
      trust_new_tools: true
      upstreams:
        - prefix: bench
          url: http://127.0.0.1:{up_port}/mcp
  - id: bench-plain
    webhook_url: http://127.0.0.1:{recv_port}/webhook
    secret: {SECRET}
""")
        up = stack.enter_context(serve("mcp-upstream", [sys.executable, "-m", "bench.mcp", "upstream", str(up_port)],
                                       up_port, {}, tmp))
        kernel = stack.enter_context(serve(
            "mcp-kernel", [sys.executable, "-m", "kernel", "serve", "--db-url", db_url, "--host", "127.0.0.1",
                           "--port", str(kernel_port), "--config", str(manifest), *(["--mcp"] if in_kernel else [])],
            kernel_port, {"REGENT_BEARER_TOKEN": token, "REGENT_SQLITE_SYNCHRONOUS": "full"}, tmp))
        kernel.wait_ready()
        procs = {"kernel": kernel.proc.pid}
        if not in_kernel:
            gw = stack.enter_context(serve(
                "mcp-gateway", [sys.executable, "-m", "kernel", "mcp", "serve", "--config", str(manifest), "--kernel",
                                kernel.url, "--port", str(gw_port)],
                gw_port, {"REGENT_MCP_KERNEL_TOKEN": token, "REGENT_LOG_LEVEL": "warning"}, tmp))
            procs["gateway"] = gw.proc.pid
        _wait(f"http://127.0.0.1:{up_port}/mcp", "the upstream")
        _wait(f"{gw_base}/health", "the MCP gateway")
        r = httpx.post(f"{kernel.url}/v0/executions", json={"agent_id": "bench-plain", "input": None},
                       headers={"Authorization": f"Bearer {token}"}, timeout=30)
        r.raise_for_status()
        eid = r.json()["id"]
        deadline = time.monotonic() + 30
        while eid not in _Receiver.leases and time.monotonic() < deadline:
            _Receiver.got.wait(0.1)
        if eid not in _Receiver.leases:
            raise RuntimeError("the plain agent's execution was never delivered")
        plain = Agent(kernel.url, "bench-plain", SECRET)
        procs["upstream"] = up.proc.pid
        before = {k: proc_cpu(pid) for k, pid in procs.items()}
        try:
            out = asyncio.run(_measure(f"{gw_base}/mcp/bench-mcp", f"http://127.0.0.1:{up_port}/mcp", plain,
                                       _Receiver.leases[eid], n, seconds, warmup))
        finally:
            plain.close()
        calls = len(out["gateway"]) + warmup
        # CPU seconds per interleaved round (a gateway call, a direct call, a plain round trip).
        out.update({f"cpu_{k}": [(proc_cpu(pid) - before[k]) / calls] for k, pid in procs.items()})
        return out


def _stats(lat: list[float]) -> dict[str, Any]:
    s = sorted(lat)
    return {"ops": len(s), "p50": percentile(s, 0.5), "p90": percentile(s, 0.9), "p99": percentile(s, 0.99),
            "mean": sum(s) / len(s) if s else float("nan"), "max": s[-1] if s else float("nan")}


def _run(p: Profile) -> list[Result]:
    import tempfile

    quick = p.name == "quick"
    n, seconds, warmup = (300, 20.0, 10) if quick else (1000, 60.0, 30)
    results: list[Result] = []
    tmp = Path(tempfile.mkdtemp(prefix="regent-bench-mcp-"))
    backends: list[tuple[str, Any]] = [
        ("sqlite", lambda: contextlib.nullcontext(f"sqlite:///{tmp}/mcp-{uuid.uuid4().hex[:6]}.db")),
        ("postgres", lambda: pg_scratch(DEFAULT_PG_URL)),
    ]
    for name, db in backends:
        for in_kernel in (False, True):
            mode = "regent serve --mcp" if in_kernel else "regent mcp"
            try:
                with db() as url:
                    m = measure(url, tmp, n, seconds, warmup, in_kernel)
            except Exception as e:
                results.append(Result(f"mcp: gateway overhead ({mode})", name, error=f"{type(e).__name__}: {e}"))
                continue
            cpu = {k[4:]: v[0] for k, v in m.items() if k.startswith("cpu_")}
            st = {k: _stats(v) for k, v in m.items() if not k.startswith("cpu_")}
            added = st["gateway"]["p50"] - st["direct"]["p50"]
            ratio = added / st["plain"]["p50"] if st["plain"]["p50"] else float("nan")
            for k, label in (("gateway", f"tools/call through {mode}"), ("direct", "tools/call to the upstream"),
                             ("plain", "plain step round trip")):
                results.append(Result(f"mcp: {label}", name, op="call" if k != "plain" else "round trip",
                                      stats={**st[k], "workers": 1}))
            results[-1].figures.append((
                f"mcp ({name}, {mode}): (gateway − direct) ÷ plain round trip, p50",
                f"{ratio:.2f}× ({added * 1e3:.2f} ms added; round trip {st['plain']['p50'] * 1e3:.2f} ms)",
                f"≤ {GOAL}×"))
            results[-1].figures.append((
                f"mcp ({name}, {mode}): CPU per round of the three, by process",
                ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in cpu.items()), "–"))
    return results


MCP = LocalScenario("mcp", "mcp", _run,
                    "a tools/call through regent mcp vs the same call direct vs a plain step round trip (own servers)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["upstream"]:
        upstream_main(int(sys.argv[2]))
    else:
        raise SystemExit(f"usage: python -m bench.mcp upstream PORT (from {ROOT})")
