"""The Prometheus metrics `GET /metrics` serves: step answers, error codes and the lane.

Counters are bumped where the answer is made (one labelled child lookup, about a microsecond);
the lane's figures are read when Prometheus scrapes, so they cost the hot path nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kernel import lane as threads
from kernel.core.kernel import Kernel


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry, kernel: Kernel | None = None):
        self.registry = registry
        self.step_decisions = Counter(
            "regent_step_decisions",
            "Answers to step submits, by step kind, decision (proceed, replay, denied, blocked, "
            "rate_limited, execution_blocked, execution_terminal), agent and the rule of a new policy "
            "decision (empty for replays and refusals before policy).",
            ["kind", "decision", "agent_id", "rule_id"],
            registry=registry,
        )
        self.approval_answers = Counter(
            "regent_approval_answers",
            "Approvals granted or denied by a person, by agent, the rule that asked and the credential "
            "(key, bootstrap, dev).",
            ["agent_id", "rule_id", "answer", "credential"],
            registry=registry,
        )
        self.labels = LabelBudget()
        self.step_outcomes = Counter(
            "regent_step_outcomes",
            "Answers to step complete/fail calls, by call and answer (recorded, replay, execution_terminal).",
            ["call", "answer"],
            registry=registry,
        )
        self.errors = Counter(
            "regent_api_errors",
            "Error answers, by the envelope's code (validation_error, unauthorized, lease_superseded, ...).",
            ["code"],
            registry=registry,
        )
        registry.register(_LaneCollector())
        if kernel is not None:
            registry.register(_KernelCollector(kernel))

    def decision(self, kind: str, decision: str, agent_id: str = "", rule_id: str | None = None) -> None:
        agent, rule = self.labels.pair(agent_id, rule_id or "")
        self.step_decisions.labels(kind, decision, agent, rule).inc()

    def approval(self, agent_id: str, rule_id: str, answer: str, credential: str) -> None:
        agent, rule = self.labels.pair(agent_id, rule_id)
        self.approval_answers.labels(agent, rule, answer, credential).inc()

    def outcome(self, failed: bool, answer: str) -> None:
        self.step_outcomes.labels("fail" if failed else "complete", answer).inc()

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()


OTHER = "_other"


class LabelBudget:
    """Keeps the `agent_id`/`rule_id` label values bounded whatever bundles return.

    Agent ids are those of registered agents (a signed request names one) and rule ids those the
    loaded bundles decide with, but a Rego bundle may build a rule id from its input: past
    `max_pairs` distinct (agent, rule) pairs, or for a value over `max_chars`, the label is
    `_other` (and past `max_agents` agents, the agent too)."""

    def __init__(self, max_pairs: int = 2000, max_agents: int = 500, max_chars: int = 128):
        self.max_pairs = max_pairs
        self.max_agents = max_agents
        self.max_chars = max_chars
        self._pairs: set[tuple[str, str]] = set()
        self._agents: set[str] = set()

    def pair(self, agent_id: str, rule_id: str) -> tuple[str, str]:
        key = (agent_id, rule_id)
        if key in self._pairs:
            return key
        agent = agent_id if len(agent_id) <= self.max_chars else OTHER
        if agent not in self._agents:
            if len(self._agents) >= self.max_agents:
                agent = OTHER
            else:
                self._agents.add(agent)
        rule = rule_id if len(rule_id) <= self.max_chars else OTHER
        if len(self._pairs) >= self.max_pairs:
            rule = OTHER
        else:
            self._pairs.add((agent, rule))  # a benign race at worst adds a pair twice over the cap
        return agent, rule


class _LaneCollector(Collector):
    """The lane as it is at scrape time (kernel/lane.py)."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lane = threads.lane()
        yield GaugeMetricFamily("regent_lane_threads", "Threads that run use cases back to back "
                                "(REGENT_CORE_THREADS).", value=lane.threads)
        yield GaugeMetricFamily("regent_lane_queued", "Use cases waiting for a lane thread.",
                                value=lane.queued())
        yield CounterMetricFamily("regent_lane_spilled", "Use cases handed to the overflow pool because "
                                  "every lane thread was on a slow call.", value=lane.spilled)
        gate = threads.inline_gate()
        if gate is not None:
            yield CounterMetricFamily("regent_lane_inline", "Step calls run on the event loop because the "
                                      "kernel was idle (REGENT_SQLITE_INLINE_IDLE_CALLS).", value=gate.ran)
            yield CounterMetricFamily("regent_lane_inline_slow", "Of those, calls over 10 ms: each sent the "
                                      "next second's calls to the lane.", value=gate.slow)


class ReplayCollector(Collector):
    """The replay guard of the app's Authenticator (kernel/core/request_reuse.py), at scrape time."""

    def __init__(self, auth: Any):
        self.auth = auth

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        guard = self.auth.replays
        yield CounterMetricFamily("regent_replays_refused", "Signed agent mutations refused 401 as a repeat of "
                                  "one already accepted (docs/api.md, Replayed requests).", value=guard.refused)
        yield GaugeMetricFamily("regent_replay_cache_entries", "Signed mutations this replica remembers "
                                "(REGENT_REPLAY_CACHE_SIZE bounds it).", value=len(guard))


class RegoPool(Protocol):
    def stats(self) -> dict[str, Any] | None: ...


class RegoPoolCollector(Collector):
    """Each Rego worker pool of this process (the active bundles', the shadows'), read at scrape
    time (`LazyRegoEngine.stats`). A pool not started yet (no Rego bundle so far) is left out."""

    def __init__(self, pools: Mapping[str, RegoPool]):
        self.pools = pools

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        live = GaugeMetricFamily("regent_rego_workers", "Rego worker processes alive, by pool (active, shadow).",
                                 labels=["pool"])
        replaced = CounterMetricFamily("regent_rego_workers_replaced", "Rego workers replaced after a timeout, "
                                       "a crash or growing past the memory bound, by pool.", labels=["pool"])
        faults = CounterMetricFamily("regent_rego_faults", "Rego evaluations that failed closed, by pool and "
                                     "kind (timeout, crash, eval_error).", labels=["pool", "kind"])
        for pool, engine in sorted(self.pools.items()):
            st = engine.stats()
            if st is None:
                continue
            live.add_metric([pool], st["workers"])
            replaced.add_metric([pool], st["workers_replaced"])
            for kind, key in (("timeout", "timeouts"), ("crash", "crashes"), ("eval_error", "eval_errors")):
                faults.add_metric([pool, kind], st[key])
        yield live
        yield replaced
        yield faults


class _KernelCollector(Collector):
    """The kernel's own counters, read at scrape time."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily("regent_dispatch_claims_skipped", "Dispatch claims that raised and were "
                                  "skipped (logged; the row's next attempt moved back).",
                                  value=self.kernel.dispatch_claims_skipped)
        shadow = self.kernel.shadow  # kernel/shadow_runner.py's runner; absent counters read as 0
        for name, attr, help in (
            ("regent_shadow_judged", "judged", "Steps judged by a shadow bundle in this process."),
            ("regent_shadow_faults", "faults", "Shadow judgements that timed out, crashed or errored."),
            ("regent_shadow_dropped", "dropped", "Steps not judged because the shadow queue was full."),
            ("regent_shadow_skipped", "skipped", "Steps not judged while a faulting shadow was paused."),
        ):
            yield CounterMetricFamily(name, help, value=getattr(shadow, attr, 0))
        yield GaugeMetricFamily("regent_shadow_backlog", "Steps observed for a shadow, not yet recorded.",
                                value=shadow.backlog())


# Agents named in a per-agent dispatch series; the rest are summed under `_other`.
MAX_DISPATCH_AGENT_LABELS = 50


class DispatchCollector(Collector):
    """This replica's deliveries (kernel/dispatcher.py, kernel/delivery_gate.py), read at scrape
    time: outcomes, what is in flight per agent, full agents and hosts, open breakers."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]):
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        st = self.stats()
        if st is None:
            return
        outcomes = CounterMetricFamily("regent_dispatch_deliveries", "Webhook deliveries by outcome: acked, "
                                       "status (a non-2xx answer), timeout, connection, error (the delivery "
                                       "raised), agent_missing.", labels=["outcome"])
        for outcome, n in sorted(st["outcomes"].items()):
            outcomes.add_metric([outcome], n)
        yield outcomes
        yield GaugeMetricFamily("regent_dispatch_in_flight", "Webhook deliveries on the wire (or waiting for a "
                                "slot of their host).", value=st["in_flight"])
        per_agent = GaugeMetricFamily("regent_dispatch_agent_in_flight", "Deliveries on the wire by agent "
                                      "(REGENT_DISPATCH_AGENT_CONCURRENCY bounds each).", labels=["agent_id"])
        for agent, n in _top(st["agents"]):
            per_agent.add_metric([agent], n)
        yield per_agent
        yield GaugeMetricFamily("regent_dispatch_agents_full", "Agents with their whole share of delivery slots "
                                "in flight.", value=st["agents_full"])
        yield GaugeMetricFamily("regent_dispatch_hosts_full", "Webhook hosts with REGENT_DISPATCH_HOST_CONCURRENCY "
                                "deliveries in flight.", value=st["hosts_full"])
        yield CounterMetricFamily("regent_dispatch_host_waits", "Deliveries that waited for a slot of their "
                                  "webhook host.", value=st["host_waits"])
        open_now = st["breakers_open"]
        yield GaugeMetricFamily("regent_dispatch_breakers_open", "Agents sent nothing after failed deliveries "
                                "in a row (their executions wait).", value=len(open_now))
        per_open = GaugeMetricFamily("regent_dispatch_breaker_open", "1 for each agent whose breaker is open.",
                                     labels=["agent_id"])
        for agent in open_now[:MAX_DISPATCH_AGENT_LABELS]:
            per_open.add_metric([agent], 1)
        yield per_open
        yield CounterMetricFamily("regent_dispatch_breaker_opened", "Times an agent's breaker opened (a failed "
                                  "probe opens it again).", value=st["breaker_opened"])


def _top(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    head, rest = ranked[:MAX_DISPATCH_AGENT_LABELS], ranked[MAX_DISPATCH_AGENT_LABELS:]
    return head + ([(OTHER, sum(n for _, n in rest))] if rest else [])
