"""The shadow scenario: step round trips of an agent whose active YAML bundle allows the step, with
no shadow and with a Rego shadow that crashes its worker on every evaluation, measured in the same
server, alternating side by side; the figure is the active p99 with the shadow / without."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from bench import fixtures
from bench.client import TARGET, Agent, Lease, drive, round_trip
from bench.scenarios import Profile, Result, Scenario, Target
from kernel.core.agents import register_agent
from kernel.core.kernel import Kernel
from kernel.policy.resolver import yaml_revision

NAME = "shadow round trip"
PLAIN, SHADOWED = "bench-active", "bench-shadowed"
ACTIVE = f"default_action: deny\nrules:\n  - id: allow-echo\n    when: {{target: {TARGET}}}\n    then: {{decision: allow}}\n"
# Passes the load gate, then overflows rego-cpp's stack on every evaluation (SIGSEGV): each judged
# step costs the shadow pool a worker, which the pool replaces with its back-off.
CRASHING = {
    "modules": {"policy.rego": (
        "package bench\nimport rego.v1\n\n"
        'decision := {"decision": "allow", "rule_id": "allow-echo"} if {\n'
        "    n := count(input.target) * 3000\n"
        '    yaml.unmarshal(concat("", [c | some _ in numbers.range(1, n); c := "["]))\n'
        "}\n")},
    "data": {},
    "manifest": {"revision": "crashing", "roots": ["bench"],
                 "metadata": {"regent": {"entrypoint": "bench/decision", "default_action": "deny"}}},
}


@dataclass
class ShadowFixture:
    plain: tuple[fixtures.AgentCreds, list[Lease]]
    shadowed: tuple[fixtures.AgentCreds, list[Lease]]


def _agent(k: Kernel, agent_id: str, shadow: bool, workers: int) -> tuple[fixtures.AgentCreds, list[Lease]]:
    secret = secrets.token_hex(16)
    register_agent(k, agent_id, fixtures.WEBHOOK, secret, fixtures.LEASE_SECONDS, keep_policy=True)
    now = k.clock.now()
    with k.store.transaction() as tx:  # written as the admin API stores them (the gate ran in tests)
        tx.add_policy_revision(agent_id, "yaml", yaml_revision(ACTIVE), ACTIVE, now)
        if shadow:
            tx.add_shadow(agent_id, "rego", "crashing", json.dumps(CRASHING, sort_keys=True), now, "bench")
    creds = fixtures.AgentCreds(agent_id, secret)
    return creds, fixtures.start_executions(k, creds, workers, agent_id)


def _prepare(k: Kernel | None, agent: fixtures.AgentCreds, p: Profile) -> ShadowFixture:
    assert k is not None
    workers = max(1, p.concurrency // 2)
    return ShadowFixture(_agent(k, PLAIN, False, workers), _agent(k, SHADOWED, True, workers))


# At least this many rounds of at least this many seconds a side: the figure is a ratio of p99s,
# and the quick profile's 2 rounds of 1 s gave ~300 round trips a side, a p99 of the 3rd-worst.
_MIN_ROUNDS = 4
_MIN_SIDE_SECONDS = 1.5


def _rounds(p: Profile) -> int:
    return max(p.rounds, _MIN_ROUNDS)


def _run(target: Target, fx: ShadowFixture, p: Profile, round_index: int) -> list[Result]:
    base = round_index * 10_000_000
    out: dict[str, Result] = {}
    sides = [("active only", fx.plain), ("with a crashing shadow", fx.shadowed)]
    if round_index % 2:
        sides.reverse()  # who goes first alternates, so drift lands on both
    for label, (creds, leases) in sides:
        def op_for(lease: Lease) -> Callable[[Agent, int], None]:
            return lambda agent, i: round_trip(agent, lease, base + i)

        def make(c: fixtures.AgentCreds = creds) -> Agent:
            return Agent(target.server.url, c.agent_id, c.secret)

        r = drive(make, [op_for(lease) for lease in leases],
                  duration=max(p.conc_seconds / p.rounds, _MIN_SIDE_SECONDS),
                  max_ops=p.conc_max_ops, warmup_ops=p.warmup_ops, warmup_seconds=p.warmup_seconds,
                  server_pid=target.server.pid)
        out[label] = Result(f"{NAME}, {label}", target.name, r)
    return [out["active only"], out["with a crashing shadow"]]


SHADOW = Scenario(
    "shadow",
    NAME,
    frozenset({"kernel"}),
    _prepare,
    _run,
    "round trips with an active YAML bundle, without and with a Rego shadow that crashes its worker",
    rounds=_rounds,
)
