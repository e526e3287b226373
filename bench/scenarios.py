"""The scenarios: each prepares its fixtures in the store before the server starts, then measures
over HTTP. Add a scenario by appending to `SCENARIOS` (see bench/README.md, "Adding a scenario").
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import fixtures
from bench.client import Agent, BenchError, CpuSample, Lease, Run, drive, round_trip, submit_body
from bench.servers import Server
from kernel.core.kernel import Kernel


@dataclass(frozen=True)
class Profile:
    """How long and how many: every loop is bounded by both."""

    name: str
    rounds: int  # interleaved rounds per round-trip scenario (targets alternate between rounds)
    seq_seconds: float  # measured seconds per target, over all rounds
    seq_max_ops: int  # per round
    conc_seconds: float
    conc_max_ops: int  # per worker, per round
    concurrency: int
    warmup_ops: int  # before each round, per worker (new connections each round)
    warmup_seconds: float
    replay_samples: int  # replays timed at each history size
    replay_seconds: float  # bound on the whole interleaved replay loop
    replay_big_steps: int
    replay_small_steps: int = 10
    rego_evaluations: int = 5000


FULL = Profile("full", rounds=5, seq_seconds=10.0, seq_max_ops=10_000, conc_seconds=10.0, conc_max_ops=20_000,
               concurrency=8, warmup_ops=10, warmup_seconds=1.0, replay_samples=1000, replay_seconds=30.0,
               replay_big_steps=10_000, rego_evaluations=5000)
QUICK = Profile("quick", rounds=2, seq_seconds=2.0, seq_max_ops=5_000, conc_seconds=2.0, conc_max_ops=10_000,
                concurrency=8, warmup_ops=5, warmup_seconds=0.5, replay_samples=200, replay_seconds=4.0,
                replay_big_steps=10_000, rego_evaluations=1000)


@dataclass
class Target:
    name: str  # "bare", "sqlite", "postgres"
    kind: str  # "bare" or "kernel"
    server: Server
    agent: fixtures.AgentCreds

    def make_agent(self) -> Agent:
        return Agent(self.server.url, self.agent.agent_id, self.agent.secret)


@dataclass
class Result:
    scenario: str
    target: str
    run: Run | None = None
    error: str | None = None
    op: str = "round trip"  # what one latency sample is
    extra: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] | None = None  # precomputed figures (p50, p99, ops, …) when there is no Run
    figures: list[tuple[str, str, str]] = field(default_factory=list)  # (label, value, goal) for the ratio table


@dataclass(frozen=True)
class Scenario:
    """`prepare(kernel, agent, profile)` runs with direct store access before the servers start
    (kernel is None for the bare target). `run(target, prepared, profile, round_index)` measures
    over HTTP and returns one Result per figure; with `rounds(profile)` > 1 the runner calls it
    that many times per target, alternating targets between calls, and merges the rounds."""

    key: str  # what --scenarios selects it by
    name: str  # what the report calls it
    kinds: frozenset[str]  # which target kinds it applies to
    prepare: Callable[[Kernel | None, fixtures.AgentCreds, Profile], Any]
    run: Callable[[Target, Any, Profile, int], list[Result]]
    description: str = ""
    rounds: Callable[[Profile], int] = lambda p: 1


def _fake_leases(n: int) -> list[Lease]:
    """The bare app ignores ids and leases; send well-formed ones so the requests are identical."""
    return [Lease(str(uuid.uuid4()), str(uuid.uuid4()), 1) for _ in range(n)]


def _leases(k: Kernel | None, agent: fixtures.AgentCreds, n: int, label: str) -> list[Lease]:
    return _fake_leases(n) if k is None else fixtures.start_executions(k, agent, n, label)


# -- round trips -------------------------------------------------------------------------------------


def _rt_prepare(workers_of: Callable[[Profile], int], label: str) -> Callable[..., list[Lease]]:
    def prepare(k: Kernel | None, agent: fixtures.AgentCreds, p: Profile) -> list[Lease]:
        return _leases(k, agent, workers_of(p), label)

    return prepare


def _rt_run(name: str, seconds_of: Callable[[Profile], float], max_of: Callable[[Profile], int]) -> Callable[..., list[Result]]:
    def run(target: Target, leases: list[Lease], p: Profile, round_index: int) -> list[Result]:
        # Each round gets its own range of step args, so every submit is a new step (→ proceed).
        base = round_index * 10_000_000

        def op_for(lease: Lease) -> Callable[[Agent, int], None]:
            return lambda agent, i: round_trip(agent, lease, base + i)

        r = drive(target.make_agent, [op_for(lease) for lease in leases], duration=seconds_of(p) / p.rounds,
                  max_ops=max_of(p), warmup_ops=p.warmup_ops, warmup_seconds=p.warmup_seconds,
                  server_pid=target.server.pid)
        return [Result(name, target.name, r)]

    return run


ROUNDTRIP_SEQUENTIAL = Scenario(
    "rt-seq",
    "round trip, sequential",
    frozenset({"bare", "kernel", "kernel-norecord"}),
    _rt_prepare(lambda p: 1, "rt-seq"),
    _rt_run("round trip, sequential", lambda p: p.seq_seconds, lambda p: p.seq_max_ops),
    "one client, one execution: submit → proceed → complete, back to back",
    rounds=lambda p: p.rounds,
)

ROUNDTRIP_CONCURRENT = Scenario(
    "rt-conc",
    "round trip, concurrent",
    frozenset({"bare", "kernel", "kernel-norecord"}),
    _rt_prepare(lambda p: p.concurrency, "rt-conc"),
    _rt_run("round trip, concurrent", lambda p: p.conc_seconds, lambda p: p.conc_max_ops),
    "N client threads, each on its own execution and its own keep-alive connection",
    rounds=lambda p: p.rounds,
)


# -- replay latency ------------------------------------------------------------------------------------


@dataclass
class ReplayFixture:
    small: list[tuple[Lease, list[fixtures.RecordedStep]]]  # executions with 10 recorded steps
    big: Lease  # the execution with 10 000 recorded steps
    big_samples: list[fixtures.RecordedStep]  # the steps replayed there, spread over the history
    warm: list[tuple[Lease, fixtures.RecordedStep]]  # replayed first, not measured


def _replay_prepare(k: Kernel | None, agent: fixtures.AgentCreds, p: Profile) -> ReplayFixture:
    assert k is not None
    per = p.replay_small_steps
    n_small = math.ceil(p.replay_samples / per)
    small_leases = fixtures.start_executions(k, agent, n_small + 1, "replay-small")
    small = []
    for lease in small_leases:
        recorded = fixtures.record_history(fixtures.sql_store(k), lease, per)
        small.append((fixtures.reclaim(k, lease), recorded))
    (big,) = fixtures.start_executions(k, agent, 1, "replay-big")
    history = fixtures.record_history(fixtures.sql_store(k), big, p.replay_big_steps)
    big = fixtures.reclaim(k, big)
    stride = max(p.replay_big_steps // p.replay_samples, 2)
    samples = history[::stride][: p.replay_samples]
    warm_big = [history[i * stride + stride // 2] for i in range(min(per, len(history) // stride))]
    warm_lease, warm_small = small.pop()
    warm = [(warm_lease, s) for s in warm_small] + [(big, s) for s in warm_big]
    return ReplayFixture(small, big, samples, warm)


def _replay_once(agent: Agent, lease: Lease, s: fixtures.RecordedStep) -> float:
    t = time.perf_counter()
    ans = agent.post(f"/v0/executions/{lease.execution_id}/steps", submit_body(s.args, s.target), lease)
    dt = time.perf_counter() - t
    if ans.get("decision") != "replay" or ans.get("step_id") != s.step_id or ans.get("result") != s.result:
        raise BenchError(f"replay of {s.step_id[:12]}… answered {ans!r}")
    return dt


def _replay_run(target: Target, fx: ReplayFixture, p: Profile, round_index: int) -> list[Result]:
    """Interleaved, one history size after the other in batches of 10, so drift (WAL growth,
    checkpoints, the other engineer's build) lands on both sides alike."""
    agent = target.make_agent()
    small_lat: list[float] = []
    big_lat: list[float] = []
    try:
        for lease, s in fx.warm:
            _replay_once(agent, lease, s)
        cpu0 = CpuSample.take(target.server.pid)
        t0 = time.perf_counter()
        stop = t0 + p.replay_seconds
        big_iter = iter(fx.big_samples)
        for lease, recorded in fx.small:
            if time.perf_counter() > stop:
                break
            for s in recorded:
                small_lat.append(_replay_once(agent, lease, s))
            for _ in range(len(recorded)):
                b = next(big_iter, None)
                if b is None:
                    break
                big_lat.append(_replay_once(agent, fx.big, b))
        wall = time.perf_counter() - t0
        cpu = CpuSample.take(target.server.pid) - cpu0
    finally:
        agent.close()
    # Both runs share one window: split the wall and CPU by op count (they interleave 10:10).
    total = len(small_lat) + len(big_lat) or 1

    def share(lat: list[float]) -> Run:
        f = len(lat) / total
        return Run(lat, wall * f, 1, CpuSample(cpu.server * f, cpu.client * f, cpu.machine * f))

    n_small = p.replay_small_steps
    return [
        Result(f"replay @{n_small} steps", target.name, share(small_lat), op="replayed submit",
               extra={"history": n_small}),
        Result(f"replay @{p.replay_big_steps} steps", target.name, share(big_lat), op="replayed submit",
               extra={"history": p.replay_big_steps}),
    ]


REPLAY = Scenario(
    "replay",
    "replay",
    frozenset({"kernel"}),
    _replay_prepare,
    _replay_run,
    "re-submits of recorded steps in a fresh attempt (answer `replay`), 10 vs 10 000 steps of history",
)


# -- in-process scenarios (no server) -------------------------------------------------------------


@dataclass(frozen=True)
class LocalScenario:
    """Measured in the bench process itself, after the servers have stopped."""

    key: str
    name: str
    run: Callable[[Profile], list[Result]]
    description: str = ""


def _rego_run(p: Profile) -> list[Result]:
    """kernel/policy/rego/bench.py: raw regopy in a child process vs the kernel's isolated path,
    once on an otherwise idle bench and once under 8 concurrent round trips (bench/rego_load.py)."""
    import logging

    from bench.rego_load import concurrent_round_trips
    from kernel.policy.rego.bench import bench_rego

    log = logging.getLogger("kernel.policy")
    level = log.level
    log.setLevel(logging.WARNING)  # the engine's start-up notes about rego-cpp would interleave the report
    try:
        quiet = bench_rego(p.rego_evaluations)
        with concurrent_round_trips(p.concurrency) as load:
            busy = bench_rego(p.rego_evaluations)
    finally:
        log.setLevel(level)
    name = "rego decision"
    under = f"under {p.concurrency} concurrent round trips"

    def stats(r: dict[str, Any], side: dict[str, float]) -> dict[str, Any]:
        return {"ops": r["n"], "workers": 1, "p50": side["p50_ms"] / 1e3, "p99": side["p99_ms"] / 1e3,
                "mean": side["mean_ms"] / 1e3}

    out = []
    for r, when in ((quiet, ""), (busy, under)):
        goals = r.get("targets", {})
        suffix = f", {when}" if when else ""
        out += [
            Result(name, f"regopy, raw in-process{suffix}", op="evaluation", stats=stats(r, r["raw_regopy"])),
            Result(name, f"worker path, in-process{suffix}", op="evaluation", stats=stats(r, r["raw_worker_path"])),
            Result(name, f"RegoEngine, isolated, workers never poll{suffix}", op="evaluation",
                   stats=stats(r, r["isolated_no_poll"]), figures=[
                       (f"rego p50: isolated with the workers' poll off / raw regopy{suffix}",
                        f"{r['ratio_p50_no_poll']:.2f}×", ""),
                       (f"rego worker CPU per evaluation, polling / poll off{suffix}",
                        f"{r['worker_cpu_us']:.0f} / {r['worker_cpu_us_no_poll']:.0f} µs", ""),
                   ]),
            Result(name, f"RegoEngine, isolated (pool {r['pool_size']}){suffix}", op="evaluation",
                   stats=stats(r, r["isolated"]), figures=[
                       (f"rego p50: isolated / raw regopy{suffix}", f"{r['ratio_p50']:.2f}×",
                        f"≤ {goals['ratio_p50_max']}×" if "ratio_p50_max" in goals else ""),
                       (f"rego p99: isolated / raw regopy{suffix}", f"{r['ratio_p99']:.2f}×", ""),
                       (f"rego p99, isolated (absolute){suffix}", f"{r['isolated']['p99_ms']:.3f} ms",
                        f"≤ {goals['isolated_p99_ms_max']} ms" if "isolated_p99_ms_max" in goals else ""),
                       # The engine alone, no isolation, beside it: under load its tail is the CPUs'.
                       (f"rego p99, raw regopy in process (absolute){suffix}",
                        f"{r['raw_regopy']['p99_ms']:.3f} ms", ""),
                   ]),
        ]
    out[-1].figures.append((f"round trips done by the load while the Rego path was timed {under}",
                            str(load.get("round_trips", "?")), ""))
    return out


def _yaml_run(p: Profile) -> list[Result]:
    """YAML decision latency: a 1-rule and a 100-rule bundle (glob rules, the step matching the
    last rule or none), evaluated in-process as the kernel does."""
    import time

    from kernel.domain import PolicyInput
    from kernel.policy.yaml import compile_yaml_bundle

    one = "default_action: deny\nrules:\n  - id: r0\n    when: {target: shell_exec, arguments: {command: {regex: '^ls'}}}\n    then: {decision: allow}\n"
    many = "default_action: deny\nrules:\n" + "".join(
        f"  - id: r{i}\n    when: {{target: 'tool_{i}_*'}}\n    then: {{decision: allow}}\n" for i in range(100))
    cases = [
        ("1 rule, match", compile_yaml_bundle(one, revision="1"), PolicyInput("a", "tool_call", "shell_exec", {"command": "ls -la"})),
        ("100 glob rules, last matches", compile_yaml_bundle(many, revision="100"), PolicyInput("a", "tool_call", "tool_99_x", {})),
        ("100 glob rules, none match", compile_yaml_bundle(many, revision="100"), PolicyInput("a", "tool_call", "other", {})),
    ]
    n = max(2000, p.rego_evaluations * 4)
    out = []
    for label, bundle, inp in cases:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            bundle.evaluate(inp)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        stats = {"ops": n, "workers": 1, "p50": samples[n // 2], "p99": samples[int(n * 0.99)],
                 "mean": sum(samples) / n}
        goal = {"1 rule, match": "≤ 10 µs", "100 glob rules, last matches": "≤ 15 µs"}.get(label, "")
        out.append(Result("yaml decision", label, op="evaluation", stats=stats,
                          figures=[(f"yaml p50, {label}", f"{stats['p50'] * 1e6:.2f} µs", goal)]))
    return out


YAML = LocalScenario("yaml", "yaml decision", _yaml_run, "YAML decision latency: 1-rule and 100-rule bundles")

REGO = LocalScenario("rego", "rego decision", _rego_run,
                     "Rego decision latency: raw regopy vs the kernel's crash-isolated worker pool")


# Later scenarios: append here (e.g. a YAML/Rego bundle on the HTTP path, approvals, LLM usage
# metering) — a Scenario to run against servers, a LocalScenario to run in-process.
SCENARIOS: list[Scenario] = [ROUNDTRIP_SEQUENTIAL, ROUNDTRIP_CONCURRENT, REPLAY]
def _policy_test_run(p: Profile) -> list[Result]:
    from bench.policy_test import bench_policy_test

    r = bench_policy_test(1000, rounds=p.rounds, coverage=True)
    stats = {"ops": r["cases"], "workers": 1, "p50": r["median_s"], "p99": r["median_s"], "mean": r["median_s"]}
    cov = {"ops": r["cases"], "workers": 1, "p50": r["coverage_median_s"], "p99": r["coverage_median_s"],
           "mean": r["coverage_median_s"]}
    return [Result("policy test", "regent policy test, 1 000 Rego cases", op="CLI run", stats=stats,
                   figures=[("policy test: 1 000 Rego cases, wall incl. start-up (median)",
                             f"{r['median_s']:.2f} s", "≤ 2 s")]),
            Result("policy test", "… with --coverage (Rego lines)", op="CLI run", stats=cov,
                   figures=[("policy test --coverage / without, 1 000 Rego cases (medians, alternating runs)",
                             f"{r['coverage_ratio']:.2f}×", "≤ 1.5×")])]


def _policy_authoring_run(p: Profile) -> list[Result]:
    from bench.policy_authoring import bench_policy_authoring

    r = bench_policy_authoring(rounds=max(3, p.rounds), n_yaml=20_000, n_rego=max(1000, p.rego_evaluations))
    names = {"baseline": f"before ({r['baseline']})", "change": f"with the change ({r['change']})",
             "checkout": "this checkout"}
    out = []
    for row in r["rows"]:
        for side in ("change", "checkout", "baseline"):
            value = row[f"{side}_p50"]
            if value is None:
                continue
            stats = {"ops": 0, "workers": 1, "p50": value, "p99": value, "mean": value}
            figures = []
            cpu = row["label"].endswith(" (CPU)")
            if f"{side}_ratio" in row:
                goal = "≤ 1.05×" if side == "change" and not cpu else ""
                what = f"{row['label'][: -len(' (CPU)')]}: CPU per decision" if cpu else f"{row['label']}: p50"
                figures.append((f"{what} {names[side]} / {names['baseline']}",
                                f"{row[f'{side}_ratio']:.3f}×", goal))
            elif side != "baseline" and row["baseline_p50"] is None:
                figures.append((f"{row['label']}: p50, {names[side]}", f"{value * 1e6:.2f} µs", ""))
            out.append(Result("policy authoring", f"{row['label']} ({names[side]})", op="evaluation", stats=stats,
                              figures=figures))
    return out


POLICY_AUTHORING = LocalScenario(
    "policy-authoring", "policy authoring", _policy_authoring_run,
    "YAML and Rego decision p50 with typed predicates and the Rego probes compiled in, vs the commit before them")


POLICY_TEST = LocalScenario("policy-test", "policy test", _policy_test_run,
                            "`regent policy test` subprocess on 1 000 cases against a Rego bundle")
LOCAL_SCENARIOS: list[LocalScenario] = [YAML, REGO, POLICY_TEST, POLICY_AUTHORING]
