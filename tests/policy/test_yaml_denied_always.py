"""`YamlBundle.denied_always` (docs/mcp.md, "Hiding denied tools"): sound against `evaluate`.

Whenever it answers True for (agent, kind, target), `evaluate` denies that step for every args
value generated; the shipped bundles answer as expected for named tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.domain.decision import PolicyInput, Verdict
from kernel.policy.yaml import YamlBundle, compile_yaml_bundle

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("fs_delete", "fs_write", "fs_read", "web_fetch")
AGENTS = ("a1", "a2")
KINDS = ("tool_call", "llm_call", "local")

_predicate = st.sampled_from([
    {"path": {"regex": "^/tmp"}},
    {"path": {"equals": "/etc/passwd"}},
    {"path": {"contains": "secret"}},
    {"force": {"equals": "true"}},
    {"size": {"gt": 10}},
    {"path": {"absent": True}},
    {"path": {"exists": True}},
    {"path": {"type": "string"}, "force": {"one_of": ["true", "yes"]}},
])
_target_cond = st.one_of(
    st.none(),
    st.builds(lambda t: {"target": t}, st.sampled_from(TARGETS)),
    st.builds(lambda ts: {"targets": ts}, st.lists(st.sampled_from(TARGETS), min_size=1, max_size=2, unique=True)),
    st.just({"target": "fs_*"}),
    st.just({"targets": ["web_*", "fs_write"]}),
)


@st.composite
def _rule(draw: Any, i: int) -> dict[str, Any]:
    when: dict[str, Any] = {}
    t = draw(_target_cond)
    if t:
        when.update(t)
    if draw(st.booleans()):
        when["step_kind"] = draw(st.sampled_from(KINDS))
    agent = draw(st.sampled_from([None, "agent_id", "agent_ids"]))
    if agent == "agent_id":
        when["agent_id"] = draw(st.sampled_from(AGENTS))
    elif agent == "agent_ids":
        when["agent_ids"] = draw(st.lists(st.sampled_from(AGENTS), min_size=1, max_size=2, unique=True))
    if draw(st.booleans()):
        when["arguments"] = draw(_predicate)
    decision = draw(st.sampled_from(["allow", "deny", "require_approval"]))
    then: dict[str, Any] = {"decision": decision}
    return {"id": f"r{i}", "when": when, "then": then}


@st.composite
def _bundle(draw: Any) -> YamlBundle:
    n = draw(st.integers(min_value=0, max_value=5))
    rules = [draw(_rule(i)) for i in range(n)]
    doc = {"default_action": draw(st.sampled_from(["allow", "deny"])), "rules": rules}
    return compile_yaml_bundle(json.dumps(doc), revision="r")  # JSON is YAML


_value = st.one_of(st.none(), st.booleans(), st.integers(-5, 50), st.sampled_from(
    ["/tmp/x", "/etc/passwd", "my-secret", "true", "yes", "", "/home/u"]))
_args = st.one_of(
    st.none(),
    st.just([1, 2]),
    st.just("not an object"),
    st.dictionaries(st.sampled_from(["path", "force", "size", "other"]), _value, max_size=4),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bundle(), st.sampled_from(AGENTS), st.sampled_from(KINDS), st.sampled_from(TARGETS),
       st.lists(_args, min_size=1, max_size=12))
def test_denied_always_is_sound(bundle: YamlBundle, agent: str, kind: str, target: str,
                                many: list[Any]) -> None:
    if not bundle.denied_always(agent, kind, target):
        return
    for args in many:
        d = bundle.evaluate(PolicyInput(agent_id=agent, kind=kind, target=target, args=args))
        assert d.verdict is Verdict.DENY, (args, d)


def _yaml(text: str) -> YamlBundle:
    return compile_yaml_bundle(text, revision="r")


def test_the_rule_walk() -> None:
    b = _yaml("""
default_action: allow
rules:
  - id: no-delete
    when: {target: fs_delete}
    then: {decision: deny}
  - id: no-tmp-writes
    when: {target: fs_write, arguments: {path: {regex: "^/tmp"}}}
    then: {decision: deny}
  - id: approve-web
    when: {target: "web_*", arguments: {url: {exists: true}}}
    then: {decision: require_approval}
  - id: deny-web
    when: {target: "web_*"}
    then: {decision: deny}
""")
    assert b.denied_always("a", "tool_call", "fs_delete")
    assert not b.denied_always("a", "tool_call", "fs_write")  # args fall through to default allow
    assert not b.denied_always("a", "tool_call", "web_fetch")  # some args reach the approval
    assert not b.denied_always("a", "tool_call", "fs_read")  # default allow
    deny_default = _yaml("""
default_action: deny
rules:
  - id: tmp-only
    when: {target: fs_write, arguments: {path: {regex: "^/tmp"}}}
    then: {decision: deny}
  - id: agent-b-reads
    when: {target: fs_read, agent_id: b}
    then: {decision: allow}
""")
    assert deny_default.denied_always("a", "tool_call", "fs_write")  # deny rule, then default deny
    assert deny_default.denied_always("a", "tool_call", "fs_read")  # the allow is agent b's
    assert not deny_default.denied_always("b", "tool_call", "fs_read")
    assert not deny_default.denied_always("a", "local", "anything")  # a local step is allowed by default


def test_the_shipped_bundles() -> None:
    def shipped(name: str) -> YamlBundle:
        return _yaml((ROOT / "bundles" / f"{name}.yaml").read_text(encoding="utf-8"))

    payments = shipped("payments")
    assert payments.denied_always("payments", "tool_call", "delete_account")  # default deny
    assert not payments.denied_always("payments", "tool_call", "get_balance")
    assert not payments.denied_always("payments", "tool_call", "shell")  # an allowlisted command passes
    assert not payments.denied_always("payments", "tool_call", "transfer_funds")
    researcher = shipped("researcher")
    assert not researcher.denied_always("researcher", "tool_call", "web_search")
    assert researcher.denied_always("researcher", "tool_call", "shell_exec")
    assert researcher.denied_always("researcher", "llm_call", "llama-3")  # deny-other-models
    shell = shipped("shell")
    assert not shell.denied_always("shell", "tool_call", "shell_exec")
    assert shell.denied_always("shell", "tool_call", "fs_delete")
    filesystem = shipped("filesystem")  # default allow
    assert not filesystem.denied_always("fs", "tool_call", "fs/delete_file")
    assert not filesystem.denied_always("fs", "tool_call", "fs/read_file")


# A Rego bundle that denies every step: still never hidden (regopy cannot prove a deny for every input).
DENY_ALL_REGO = json.dumps({
    "modules": {"policy.rego": 'package regent\nimport rego.v1\n\n'
                               'decision := {"decision": "deny", "rule_id": "no"}\n'},
    "data": {}, "manifest": {"roots": ["regent"]},
})


def test_the_resolver_answers_from_the_active_bundle_and_never_for_rego_or_a_broken_bundle(store: Any) -> None:
    from datetime import UTC, datetime

    from kernel.domain import Agent
    from kernel.policy.resolver import BundleResolver

    now = datetime(2026, 1, 1, tzinfo=UTC)
    tools = ["fs_delete_file", "fs_write_file", "fs_read_file"]
    with store.transaction() as tx:
        for agent in ("y", "r", "broken", "none"):
            tx.upsert_agent(Agent(id=agent, webhook_url="http://127.0.0.1:9/", secret="s", registered_at=now))
        tx.add_policy_revision("y", "yaml", "r1", """
default_action: allow
rules:
  - id: no-deletes
    when: {target: fs_delete_file}
    then: {decision: deny}
  - id: no-etc-writes
    when: {target: fs_write_file, arguments: {path: {regex: "^/etc"}}}
    then: {decision: deny}
""", now)
        tx.add_policy_revision("r", "rego", "r1", DENY_ALL_REGO, now)
        tx.add_policy_revision("broken", "yaml", "r1", "rules: [", now)

    def refuse(content: str, revision: str) -> Any:
        raise ValueError("does not compile")

    resolver = BundleResolver(store)
    assert resolver.denied_always("y", "tool_call", tools) == {"fs_delete_file"}
    try:
        # the Rego bundle compiles and denies the step, yet is never said to deny it always
        denied = resolver.decide(PolicyInput(agent_id="r", kind="tool_call", target="fs_read_file", args={}))
        assert (denied.verdict, denied.rule_id) == (Verdict.DENY, "no"), denied
        assert resolver.denied_always("r", "tool_call", tools) == frozenset()  # Rego never hides
    finally:
        resolver.close()
    assert resolver.denied_always("broken", "tool_call", tools) == frozenset()
    assert resolver.denied_always("none", "tool_call", tools) == frozenset()  # no bundle: permissive
    assert resolver.denied_always("ghost", "tool_call", tools) == frozenset()
    assert BundleResolver(store, compilers={"yaml": refuse}).denied_always("y", "tool_call", tools) == frozenset()
