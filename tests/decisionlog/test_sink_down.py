"""The decision-log endpoint down under a bounded load, through a real kernel served over HTTP:
the kernel keeps answering, the buffer never passes its bound, what is dropped is counted in
/metrics (shipped + dropped = produced, exactly), and a masked field reaches no sink — not the
rotating file, not stdout, not the HTTP endpoint."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernel.api.app import create_app
from kernel.core.kernel import Kernel
from kernel.core.policies import store_policy
from kernel.decisionlog import (
    DecisionLog,
    DecisionLogCollector,
    FileSink,
    HttpSink,
    StdoutSink,
    parse_mask_rules,
)
from kernel.policy.resolver import BundleResolver
from tests.conftest import Running
from tests.decisionlog.collector import Collector
from tests.support import AgentClient, ServerThread, free_port

SECRET = "s3cr3t-Pa55w0rd-never-logged"
BUNDLE = """
default_action: deny
rules:
  - id: allow-transfer
    when: {target: transfer_funds}
    then: {decision: allow}
"""
BUFFER = 40


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def _wait(predicate: object, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def sqlite_kernel(sqlite_store: object, clock: object) -> Kernel:
    return Kernel(store=sqlite_store, clock=clock)  # type: ignore[arg-type]


def test_sink_down_under_load_keeps_the_kernel_answering_and_never_logs_a_masked_field(
    sqlite_kernel: Kernel, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    k = sqlite_kernel
    running = Running(k)
    k.policy = BundleResolver(k.store)
    store_policy(k, running.agent_id, "yaml", BUNDLE)
    port = free_port()
    http = HttpSink(f"http://127.0.0.1:{port}/logs", buffer_size=BUFFER, batch_size=10, flush_interval=0.05,
                    timeout=1.0, retry_min_delay=0.05, retry_max_delay=0.2)
    log_file = tmp_path / "decisions.jsonl"
    dl = DecisionLog([FileSink(str(log_file), max_bytes=64 * 1024, backups=50), StdoutSink(), http],
                     masks=parse_mask_rules("/args/password,/execution/input/api_key"), buffer_size=1000)
    k.decision_log = dl
    app = create_app(k, dev=True, bearer_token="boot")
    app.state.metrics_registry.register(DecisionLogCollector(dl))
    dl.start()
    collector = Collector(port)  # bound (so the port is ours) but not serving: connections hang
    collector.server.server_close()  # ... so close it: the endpoint refuses connections
    produced = 0
    try:
        with ServerThread(app) as srv:
            c = AgentClient(srv.url, running.agent_id, running.secret)
            eid, did, att = running.start({"api_key": SECRET})
            c.lease(did, att)

            def burst(n: int) -> None:
                nonlocal produced
                for i in range(n):
                    r = c.submit(eid, "transfer_funds", {"amount": i, "password": SECRET})
                    assert r.status_code == 200 and r.json()["decision"] == "proceed", r.text
                    assert c.complete_step(eid, r.json()["step_id"], {"ok": True}).status_code == 200
                    produced += 1
                    assert http.buffered() <= BUFFER and dl.buffered() <= 1000

            burst(150)  # endpoint refusing connections
            assert _wait(lambda: dl.buffered() == 0)
            assert http.buffered() <= BUFFER
            dropped_while_down = _metric(srv.url, "regent_decision_log_dropped_total", sink="http",
                                         reason="buffer_full")
            # All but the buffer (and a batch that may be out for a retry at this instant) dropped.
            assert dropped_while_down >= 150 - BUFFER - 10
            assert _metric(srv.url, "regent_decision_log_uploads_failed_total") >= 1

            collector = Collector(port)
            collector.status = 503  # up, but failing: still retried, still bounded
            collector.start()
            burst(60)
            assert http.buffered() <= BUFFER
            assert _wait(lambda: collector.requests >= 1) and collector.count() == 0

            collector.status = 204  # back: the buffer drains
            assert _wait(lambda: http.buffered() == 0 and dl.buffered() == 0)
            burst(30)

            def settled() -> tuple[float, float]:
                return (_metric(srv.url, "regent_decision_log_shipped_total"),
                        _metric(srv.url, "regent_decision_log_dropped_total", sink="http", reason="buffer_full"))

            # Empty buffers are not the end: the uploader may hold a batch it has taken and not yet
            # sent (seen once in CI: 69 shipped + 170 dropped of 240, the last entry in flight).
            # An entry that is lost instead never settles, and the sum below fails.
            _wait(lambda: http.buffered() == 0 and dl.buffered() == 0 and sum(settled()) == produced)
            shipped, dropped = settled()
            assert _metric(srv.url, "regent_decision_log_entries_total") == produced == 240
            assert shipped == collector.count()
            assert shipped + dropped == produced  # every entry is either shipped or counted
            assert shipped >= 30 + BUFFER
            c.close()
    finally:
        dl.close()
        collector.stop()

    # The HTTP endpoint: gzip JSON arrays (OPA's protocol), masked entries only.
    assert all(h.get("Content-Encoding") == "gzip" and h.get("Content-Type") == "application/json"
               for h in collector.headers)
    assert all(SECRET.encode() not in __import__("gzip").decompress(b) for b in collector.raw)
    for e in collector.entries:
        assert "password" not in e["input"]["args"] and "api_key" not in e["input"]["execution"]["input"]
        assert e["erased"] == ["/input/args/password", "/input/execution/input/api_key"]
    # The rotating file: every entry (a local sink does not drop), across the rotated files.
    files = sorted(tmp_path.glob("decisions.jsonl*"))
    assert len(files) > 1  # it rotated
    text = "".join(f.read_text() for f in files)
    assert len(text.splitlines()) == produced
    assert SECRET not in text
    # stdout: every entry, masked.
    out = capfd.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith('{"decision_id"')]) == produced
    assert SECRET not in out
