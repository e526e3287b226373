"""The provisioning manifest: expansion, strict parsing with file:line errors, upsert on boot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernel.cli import main as cli_main
from kernel.core.kernel import Kernel
from kernel.errors import ConfigError
from kernel.manifest import expand_env, load_manifest, parse_manifest, provision
from tests.support import free_port

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
agents:
  - id: hello
    webhook_url: http://127.0.0.1:8081/webhook
    secret: ${HELLO_SECRET}
  - id: shell
    webhook_url: $SHELL_URL
    secret: s3cret
    lease_timeout_seconds: 30
    policy_file: bundles/shell.yaml
  - id: inline
    webhook_url: http://127.0.0.1:8083/webhook
    secret: s3cret
    policy: |
      default_action: allow
      rules: []
"""
ENV = {"HELLO_SECRET": "hs", "SHELL_URL": "http://127.0.0.1:8082/webhook"}


def write(tmp_path: Path, text: str, name: str = "regent.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("$A-${B}", {"A": "1", "B": "2"}, "1-2"),
        ("x $UNSET ${UNSET} y", {}, "x $UNSET ${UNSET} y"),
        ("${A:-dflt} ${B:-dflt}", {"A": "set"}, "set dflt"),
        ("${A:-dflt}", {"A": ""}, "dflt"),
        ("cost: $5 and $$", {}, "cost: $5 and $$"),
    ],
    ids=["bare-and-braced", "unset-left-as-written", "default-when-unset", "default-when-empty", "not-a-name"],
)
def test_expand_env(text: str, env: dict[str, str], expected: str) -> None:
    assert expand_env(text, env) == expected


def test_manifest_parses_agents_with_expanded_values(tmp_path: Path) -> None:
    (tmp_path / "bundles").mkdir()
    (tmp_path / "bundles" / "shell.yaml").write_text("default_action: deny\nrules: []\n")
    m = load_manifest(write(tmp_path, GOOD), env=ENV)
    hello, shell, inline = m.agents
    assert (hello.id, hello.secret, hello.lease_timeout_seconds, hello.policy_source) == ("hello", "hs", None, None)
    assert (shell.webhook_url, shell.lease_timeout_seconds) == ("http://127.0.0.1:8082/webhook", 30)
    assert shell.policy_file == tmp_path / "bundles" / "shell.yaml"  # relative to the manifest
    assert inline.policy == "default_action: allow\nrules: []\n"
    assert (hello.line, shell.line, inline.line) == (2, 5, 10)
    assert m.warnings == ()


def test_inline_policy_mapping_keeps_its_own_text(tmp_path: Path) -> None:
    text = ("agents:\n  - id: a\n    webhook_url: http://h/webhook\n    secret: s\n    policy:\n"
            "      default_action: deny   # closed\n      rules:\n        - id: r\n")
    [a] = parse_manifest(text, tmp_path / "m.yaml", {}).agents
    assert a.policy == "default_action: deny   # closed\nrules:\n  - id: r\n"


def test_unset_variable_in_a_secret_is_kept_and_warned_about(tmp_path: Path) -> None:
    m = parse_manifest("agents:\n- id: a\n  webhook_url: http://h/w\n  secret: ${NOPE}\n", tmp_path / "m.yaml", {})
    assert m.agents[0].secret == "${NOPE}"
    [warning] = m.warnings
    assert "m.yaml:4" in warning and "${NOPE" in warning


def test_lease_below_the_minimum_is_ignored_with_a_warning(tmp_path: Path) -> None:
    text = "agents:\n- id: a\n  webhook_url: http://h/w\n  secret: s\n  lease_timeout_seconds: 5\n"
    m = parse_manifest(text, tmp_path / "m.yaml", {})
    assert m.agents[0].lease_timeout_seconds == 5
    assert "below 10" in m.warnings[0]


def test_empty_agent_list_is_allowed(tmp_path: Path) -> None:
    assert parse_manifest("agents: []\n", tmp_path / "m.yaml", {}).agents == ()
    assert parse_manifest("agents:\n", tmp_path / "m.yaml", {}).agents == ()


AGENT = "agents:\n  - id: a\n    webhook_url: http://h/webhook\n    secret: s\n"
BAD = [
    ("", None, "empty"),
    ("agents: [\n", 2, "invalid YAML"),
    ("- a\n", 1, "must be a mapping"),
    ("version: 1\n" + AGENT, 1, "unknown key 'version'"),
    ("agentz: []\n", 1, "unknown key 'agentz'"),
    ("{}\n", 1, "missing key `agents`"),
    ("agents: {id: a}\n", 1, "must be a list"),
    (AGENT + "    color: red\n", 5, "unknown key 'color'"),
    (AGENT + "    secret: t\n", 5, "duplicate key 'secret'"),
    ("agents:\n  - id: a\n    secret: s\n", 2, "missing `webhook_url`"),
    (AGENT.replace("http://h/webhook", "ftp://h/x"), 2, "webhook_url must be an http(s) URL"),
    (AGENT.replace("secret: s", "secret: 123"), 4, "`secret` must be a string"),
    (AGENT.replace("secret: s", "secret: ''"), 2, "secret must not be empty"),
    (AGENT + "    lease_timeout_seconds: 30s\n", 5, "whole number of seconds"),
    (AGENT + "    lease_timeout_seconds: true\n", 5, "whole number of seconds"),
    (AGENT + "    policy: x\n    policy_file: p.yaml\n", 6, "mutually exclusive"),
    (AGENT + "    policy_file: missing.yaml\n", 5, "policy_file 'missing.yaml' not found"),
    (AGENT + "    policy: [1]\n", 5, "bundle text or a mapping"),
    (AGENT + AGENT.removeprefix("agents:\n"), 5, "listed twice (first at line 2)"),
]


@pytest.mark.parametrize(("text", "line", "reason"), BAD, ids=[b[2].split("'")[0].strip(" `") or b[2] for b in BAD])
def test_malformed_manifest_names_file_line_and_reason(tmp_path: Path, text: str, line: int | None, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_manifest(path, env={})
    msg = exc.value.message
    prefix = f"{path}:{line}: " if line is not None else f"{path}: "
    assert msg.startswith(prefix), msg
    assert reason in msg, msg


def test_unreadable_manifest_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "nope.yaml"))):
        load_manifest(tmp_path / "nope.yaml")


# -- provisioning -------------------------------------------------------------------------
def test_provision_upserts_listed_agents_and_hands_bundles_to_the_hook(tmp_path: Path, kernel: Kernel) -> None:
    (tmp_path / "bundles").mkdir()
    (tmp_path / "bundles" / "shell.yaml").write_text("default_action: deny\nrules: []\n")
    m = load_manifest(write(tmp_path, GOOD), env=ENV)
    applied: list[tuple[str, Any]] = []
    provision(kernel, m, apply=lambda agent_id, source: applied.append((agent_id, source)))
    with kernel.store.read() as tx:
        agents = {a.id: a for a in tx.list_agents()}
    assert set(agents) == {"hello", "shell", "inline"}
    assert (agents["shell"].secret, agents["shell"].lease_timeout_seconds) == ("s3cret", 30)
    assert applied == [("shell", tmp_path / "bundles" / "shell.yaml"), ("inline", "default_action: allow\nrules: []\n")]


def test_reprovisioning_updates_agents_keeps_their_policy_and_leaves_others_alone(tmp_path: Path, kernel: Kernel) -> None:
    first = parse_manifest(AGENT, tmp_path / "m.yaml", {})
    provision(kernel, first)
    provision(kernel, parse_manifest("agents:\n  - id: other\n    webhook_url: http://o/w\n    secret: o\n",
                                     tmp_path / "n.yaml", {}))
    with kernel.store.transaction() as tx:
        tx.add_policy_revision("a", "yaml", "r1", "default_action: allow\nrules: []\n", kernel.clock.now())
    provision(kernel, parse_manifest(AGENT.replace("http://h/", "http://h2/"), tmp_path / "m.yaml", {}))
    with kernel.store.read() as tx:
        assert tx.get_agent("a").webhook_url == "http://h2/webhook"  # type: ignore[union-attr]
        assert tx.get_agent("other") is not None
    with kernel.store.read() as tx:
        assert tx.active_policy("a").revision == "r1"  # kept: the manifest upsert does not clear it


def test_shipped_dev_manifest_loads_with_its_dev_defaults() -> None:
    m = load_manifest(REPO / "bundles" / "regent.yaml", env={})
    assert {a.id: a.webhook_url for a in m.agents} == {
        "hello": "http://127.0.0.1:8081/webhook", "shell": "http://127.0.0.1:8082/webhook"}
    assert {a.secret for a in m.agents} == {"regent-dev-secret"}
    assert m.agents[1].policy_file == REPO / "bundles" / "shell.yaml"
    assert m.warnings == ()


def test_dev_refuses_to_start_on_a_malformed_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, AGENT + "    colour: red\n")
    db = tmp_path / "r.db"
    assert cli_main(["dev", "--db-url", f"sqlite:///{db}", "--config", str(bad), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:5" in " ".join(err.split()) and "colour" in err
    assert not db.exists()  # the manifest is checked before the store is opened
