"""`regent policy test BUNDLE --execution/--last`: replay against a real kernel over loopback; exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kernel.cli import main
from kernel.core.kernel import Kernel
from kernel.policy.resolver import BundleResolver
from tests.api.test_policy_test_endpoint import PERMISSIVE, STRICTER
from tests.conftest import Running
from tests.support import AgentClient, ServerThread


@pytest.fixture
def two_executions(kernel: Kernel, server: ServerThread, running: Running, agent_client: AgentClient) -> list[str]:
    """Two recorded executions under PERMISSIVE, oldest first: the first runs `rm`, the second only `ls`."""
    kernel.policy = BundleResolver(kernel.store)
    assert httpx.post(f"{server.url}/v0/policies/shell", json={"bundle": PERMISSIVE}).status_code == 204
    ids = []
    for command in ("rm -rf /", "ls"):
        eid, did, att = running.start()
        assert agent_client.lease(did, att).submit(eid, "shell_exec", {"command": command}).json()["decision"] == "proceed"
        ids.append(eid)
    return ids


def _bundle(tmp_path: Path, text: str) -> str:
    p = tmp_path / "candidate.yaml"
    p.write_text(text)
    return str(p)


def test_execution_with_a_change_exits_two_and_json_lists_it(
        tmp_path: Path, server: ServerThread, two_executions: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["policy", "test", _bundle(tmp_path, STRICTER), "--execution", two_executions[0],
                 "--agent-id", "shell", "--kernel", server.url, "--format", "json"])
    assert code == 2
    report = json.loads(capsys.readouterr().out)
    assert report["changed"] == 1
    [rep] = report["executions"]
    assert [(x["rule_id"], x["was_rule"]) for x in rep["results"] if not x["pass"]] == [("deny-rm", "allow-shell")]


def test_execution_without_change_exits_zero(tmp_path: Path, server: ServerThread, two_executions: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", _bundle(tmp_path, STRICTER), "--execution", two_executions[1],
                 "--agent-id", "shell", "--kernel", server.url]) == 0
    assert "0 of 1 replayed decisions would change" in capsys.readouterr().out


def test_last_n_replays_newest_first(tmp_path: Path, server: ServerThread, two_executions: list[str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", _bundle(tmp_path, STRICTER), "--last", "2", "--agent-id", "shell",
                 "--kernel", server.url, "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert [r["execution_id"] for r in report["executions"]] == list(reversed(two_executions))
    assert [r["failed"] for r in report["executions"]] == [0, 1]
    assert main(["policy", "test", _bundle(tmp_path, STRICTER), "--last", "1", "--agent-id", "shell",
                 "--kernel", server.url]) == 0


def test_pretty_output_names_old_and_new_rule(tmp_path: Path, server: ServerThread, two_executions: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", _bundle(tmp_path, STRICTER), "--execution", two_executions[0],
                 "--agent-id", "shell", "--kernel", server.url]) == 2
    text = capsys.readouterr().out
    assert "allow-shell" in text and "deny-rm" in text and "1 of 1 replayed decisions would change" in text
    assert two_executions[0] in text  # piped, not a terminal: the id is whole, not folded to 80 columns


@pytest.mark.parametrize("extra", [[], ["--last", "2"]], ids=["no-agent-id", "execution-and-last"])
def test_usage_errors_exit_one(tmp_path: Path, extra: list[str]) -> None:
    argv = ["policy", "test", _bundle(tmp_path, STRICTER), "--execution", "x", *extra]
    if extra:
        argv += ["--agent-id", "shell"]
    assert main(argv) == 1


@pytest.mark.parametrize("n", ["0", "-3", "101"])
def test_last_out_of_range_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], n: str) -> None:
    # `--last 0` used to fall through to the ordinary case-file run.
    assert main(["policy", "test", _bundle(tmp_path, STRICTER), "--last", n, "--agent-id", "shell"]) == 1
    assert "--last must be between 1 and 100" in capsys.readouterr().err


def test_bad_bundle_unknown_execution_and_unreachable_kernel_exit_one(
        tmp_path: Path, server: ServerThread, two_executions: list[str]) -> None:
    bad = _bundle(tmp_path, "rules:\n  - id: x\n    then: {decison: allow}\n")
    assert main(["policy", "test", bad, "--execution", two_executions[0], "--agent-id", "shell",
                 "--kernel", server.url]) == 1
    good = _bundle(tmp_path, STRICTER)
    assert main(["policy", "test", good, "--execution", "01890000-0000-7000-8000-000000000000",
                 "--agent-id", "shell", "--kernel", server.url]) == 1
    assert main(["policy", "test", good, "--execution", two_executions[0], "--agent-id", "shell",
                 "--kernel", "http://127.0.0.1:9"]) == 1


def test_regent_process_replays_rego_directory(tmp_path: Path, server: ServerThread, two_executions: list[str]) -> None:
    from tests.api.test_policy_test_endpoint import REGO_STRICTER

    d = tmp_path / "rego"
    d.mkdir()
    for name, src in REGO_STRICTER["modules"].items():
        (d / name).write_text(src)
    (d / ".manifest").write_text(json.dumps(REGO_STRICTER["manifest"]))
    env = {**os.environ, "REGENT_BEARER_TOKEN": "boot-token"}
    proc = subprocess.run([sys.executable, "-m", "kernel.cli", "policy", "test", str(d), "--execution",
                           two_executions[0], "--agent-id", "shell", "--kernel", server.url, "--format", "json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    rep = json.loads(proc.stdout)["executions"][0]
    assert [(x["decision"], x["rule_id"]) for x in rep["results"] if not x["pass"]] == [("deny", "rego-default")]
