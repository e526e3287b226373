"""Each shipped Rego bundle (`bundles/<name>-rego/`) makes the same decisions as its YAML twin on the
twin's case file, and the policy admin API accepts it as JSON and as a .tar.gz."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel.core.kernel import Kernel
from kernel.policy.cases import parse_cases, run_cases
from kernel.policy.rego import RegoEngine, compile_rego_bundle
from kernel.policy.resolver import RegoCompiled
from kernel.policy.yaml import compile_yaml_bundle
from tests.conftest import Running
from tests.support import AgentClient, ServerThread

ROOT = Path(__file__).resolve().parents[2]
TWINS = sorted(p for p in (ROOT / "bundles").glob("*-rego") if p.is_dir())


@pytest.fixture(scope="module")
def engine() -> Iterator[RegoEngine]:
    e = RegoEngine(size=1)
    yield e
    e.close()


@pytest.mark.parametrize("twin", TWINS, ids=[p.name for p in TWINS])
def test_rego_twin_agrees_with_yaml_bundle(twin: Path, engine: RegoEngine) -> None:
    name = twin.name.removesuffix("-rego")
    yaml_bundle = compile_yaml_bundle((ROOT / "bundles" / f"{name}.yaml").read_text(), revision=name)
    rego = RegoCompiled(compile_rego_bundle(twin, engine=engine), engine)
    cases = parse_cases((ROOT / "policy_tests" / f"{name}.policytest.yaml").read_text())
    got_yaml = run_cases(yaml_bundle, cases)
    got_rego = run_cases(rego, cases)
    assert [r.failure for r in got_rego.results if not r.passed] == []
    assert [(r.decision, r.rule_id) for r in got_rego.results] == [(r.decision, r.rule_id) for r in got_yaml.results]


def _mapping(twin: Path) -> dict[str, object]:
    return {
        "modules": {"policy.rego": (twin / "policy.rego").read_text()},
        "data": json.loads((twin / "data.json").read_text()),
        "manifest": json.loads((twin / ".manifest").read_text()),
    }


def _tarball(twin: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in (".manifest", "policy.rego", "data.json"):
            tar.add(twin / f, arcname=f)
    return buf.getvalue()



@pytest.mark.parametrize("upload", ["json", "tarball"])
def test_rego_bundle_governs_an_agent_over_http(governed: Kernel, server: ServerThread, running: Running,
                                               agent_client: AgentClient, upload: str) -> None:
    twin = ROOT / "bundles" / "shell-rego"
    if upload == "json":
        r = httpx.post(f"{server.url}/v0/policies/shell", json={"kind": "rego", "bundle": _mapping(twin)}, timeout=30)
    else:
        r = httpx.post(f"{server.url}/v0/policies/shell", content=_tarball(twin),
                       headers={"Content-Type": "application/gzip"}, timeout=30)
    assert r.status_code == 204, r.text
    eid, did, att = running.start()
    agent_client.lease(did, att)
    assert agent_client.submit(eid, "shell_exec", {"command": "ls -la"}).json()["decision"] == "proceed"
    denied = agent_client.submit(eid, "curl", {}).json()
    assert (denied["decision"], denied["rule_id"]) == ("denied", "default")
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    allowed = next(e for e in events if e["type"] == "step.allowed")["payload"]
    assert (allowed["policy_kind"], allowed["policy_revision"]) == ("rego", "shell-rego-2026-12-03.1")


def test_rego_bundle_with_compile_error_is_400_with_file_line(governed: Kernel, server: ServerThread,
                                                             running: Running) -> None:
    bad = {"modules": {"policy.rego": "package shell\n\ndecision := {\n"}, "manifest": {"roots": ["shell"]}}
    r = httpx.post(f"{server.url}/v0/policies/shell", json={"kind": "rego", "bundle": bad}, timeout=30)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert "policy.rego:" in r.json()["message"]


CONFLICT = """package shell
import rego.v1

mode := "read" if {
	input.args.command == "ls"
}

mode := "write" if {
	input.target == "shell_exec"
}

decision := {"decision": "allow", "rule_id": "read"} if {
	mode == "read"
}
"""


def test_an_eval_conflict_names_file_line_and_rule_in_the_answer_and_the_event(
        governed: Kernel, server: ServerThread, running: Running, agent_client: AgentClient) -> None:
    bundle = {"modules": {"policy.rego": CONFLICT}, "manifest": {"roots": ["shell"]}}
    r = httpx.post(f"{server.url}/v0/policies/shell", json={"kind": "rego", "bundle": bundle}, timeout=30)
    assert r.status_code == 204, r.text
    eid, did, att = running.start()
    agent_client.lease(did, att)
    denied = agent_client.submit(eid, "shell_exec", {"command": "ls"}).json()
    assert (denied["decision"], denied["rule_id"]) == ("denied", "eval-error")
    events = httpx.get(f"{server.url}/v0/executions/{eid}/events").json()
    payload = next(e for e in events if e["type"] == "step.denied")["payload"]
    assert "at policy.rego:4, policy.rego:8 (rule mode:" in payload["reason"]
