"""Wiring: Settings → store, policy resolver, limiter, kernel, app. The one place that picks
concrete classes."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from kernel.config import Settings
from kernel.core.kernel import Kernel
from kernel.errors import ConfigError
from kernel.manifest import Manifest, load_manifest, provision
from kernel.store import SqlStore, open_store
from kernel.store.migrations import migrate

if TYPE_CHECKING:
    from kernel.lane import Lane


@dataclass
class Runtime:
    settings: Settings
    store: SqlStore
    kernel: Kernel
    app: FastAPI
    closers: list[Any] = field(default_factory=list)
    manifest: Manifest | None = None
    lane: Lane | None = None  # the lane its use cases run on (kernel/lane.py); None: not built by build_runtime

    def close(self) -> None:
        for c in reversed(self.closers):
            c()
        self.store.close()


def build_kernel(settings: Settings, store: SqlStore, **overrides: Any) -> Kernel:
    return Kernel(
        store=store,
        replica_id=settings.replica_id,
        dispatch_max_attempts=settings.dispatch_max_attempts,
        dispatch_base_delay=settings.dispatch_base_delay,
        dispatch_max_delay=settings.dispatch_max_delay,
        dispatch_lease_timeout=settings.dispatch_lease_timeout,
        approval_timeout=settings.approval_timeout,
        deadline_timeout=settings.deadline_timeout,
        retention=settings.retention,
        decision_retention=settings.decision_retention,
        shadow_retention=settings.shadow_retention,
        record_decisions=settings.record_decisions,
        bootstrap_approvals=settings.bootstrap_approvals,
        agent_cache_ttl=settings.agent_cache_ttl,
        max_backlog=settings.max_backlog,
        **overrides,
    )


def background_hooks(settings: Settings, kernel: Kernel) -> list[Any]:
    """Lifespan hooks for the app: the dispatcher (delivery loop + lease reaper) and the sweeps."""
    from kernel.dispatcher import Dispatcher, DispatcherThread
    from kernel.sweeper import Sweeper

    async def dispatcher(app: FastAPI) -> Any:
        from kernel.lane import call_first

        # On a loop of its own, its transactions on the lane ahead of the requests' (kernel/dispatcher.py).
        d = DispatcherThread(lambda: Dispatcher(
            kernel, concurrency=settings.dispatch_concurrency, timeout=settings.dispatch_timeout,
            poll_interval=settings.dispatch_poll_interval, run_blocking=call_first,
            agent_concurrency=settings.dispatch_agent_concurrency,
            host_concurrency=settings.dispatch_host_concurrency,
            breaker_failures=settings.dispatch_breaker_failures, breaker_reset=settings.dispatch_breaker_reset))
        await d.start()
        app.state.dispatcher = d
        from kernel.api.metrics import DispatchCollector

        collector = DispatchCollector(d.stats)
        app.state.metrics_registry.register(collector)

        async def stop() -> None:
            app.state.metrics_registry.unregister(collector)
            await d.stop()

        return stop

    async def sweeper(app: FastAPI) -> Any:
        s = Sweeper(kernel, leader_key=settings.leader_lock_key, cleanup_interval=settings.cleanup_interval,
                    deadline_check_interval=settings.deadline_check_interval,
                    decision_flush_interval=settings.decision_flush_interval)
        await s.start()
        return s.stop

    return [dispatcher, sweeper]


def heap_hooks() -> list[Any]:
    """The last start-up hook: what start-up built (modules, the app and its routes, compiled
    bundles, prepared statements) lives as long as the process, so it is moved out of the
    collector's reach (`gc.freeze`). A full collection then walks only what requests made since:
    before, one walked the whole start-up heap and held every request for 40-80 ms, the p99 of
    the console's pages and the API's reads (bench/README.md)."""

    async def hook(app: FastAPI) -> Any:
        import gc

        gc.collect()
        gc.freeze()

        async def stop() -> None:
            gc.unfreeze()

        return stop

    return [hook]


def decision_log_hooks(decision_log: Any) -> list[Any]:
    """The decision log's threads run while the app serves; at shutdown what is buffered gets
    one bounded last attempt (kernel/decisionlog)."""
    if decision_log is None:
        return []

    async def hook(app: FastAPI) -> Any:
        decision_log.start()

        async def stop() -> None:
            import anyio

            await anyio.to_thread.run_sync(decision_log.close)

        return stop

    return [hook]


def bundle_hooks(kernel: Kernel, sources: list[Any]) -> list[Any]:
    """The bundle puller polls while the app serves; /v0/ready and /metrics show its state."""
    if not sources:
        return []

    async def hook(app: FastAPI) -> Any:
        import anyio

        from kernel.bundle_puller import BundlePuller, BundlePullerCollector

        puller = await anyio.to_thread.run_sync(BundlePuller, kernel, sources)
        app.state.bundle_puller = puller
        app.state.metrics_registry.register(BundlePullerCollector(puller))
        puller.start()

        async def stop() -> None:
            await anyio.to_thread.run_sync(puller.close)

        return stop

    return [hook]


def stream_hooks(settings: Settings, store: SqlStore) -> list[Any]:
    """The stream side channel's broker: LISTEN/NOTIFY on PostgreSQL (replicas share deltas);
    on SQLite the routes make an in-process broker on first use (one kernel per file)."""
    if store.dialect != "postgresql" or not settings.db_url:
        return []
    from kernel.stream.postgres import postgres_stream_hook

    return [postgres_stream_hook(settings.db_url)]


def build_judge(settings: Settings, manifest: Manifest | None, env: Mapping[str, str]) -> Any:
    """The judge port: the deployment's provider (REGENT_JUDGE_PROVIDER, else the manifest's
    `judge_provider`, else the built-in TypeSafe provider when an API key is set:
    REGENT_JUDGE_API_KEY or upstream's REBUNO_TYPESAFE_API_KEY) and per-agent ones from the
    manifest; none at all: NoJudge."""
    from kernel.core.ports import NoJudge
    from kernel.judge import HttpJudge, JudgeLimits, load_provider, typesafe_provider

    default_path = settings.judge_provider or (manifest.judge_provider if manifest else None)
    per_agent = {a.id: load_provider(a.judge_provider, env)
                 for a in (manifest.agents if manifest else ()) if a.judge_provider is not None}
    api_key = (settings.judge_api_key.get_secret_value() if settings.judge_api_key else "") or env.get(
        "REBUNO_TYPESAFE_API_KEY", "")
    if default_path is None and not per_agent and not api_key:
        return NoJudge()
    limits = JudgeLimits(timeout_seconds=settings.judge_timeout, concurrency=settings.judge_concurrency,
                         breaker_failures=settings.judge_breaker_failures,
                         breaker_reset_seconds=settings.judge_breaker_reset)
    default = (load_provider(default_path, env) if default_path
               else typesafe_provider(api_key, settings.judge_url) if api_key else None)
    return HttpJudge(default, per_agent, limits, mask=_args_mask(settings.decision_log_mask))


def _args_mask(rules_text: str | None) -> Callable[[Any], Any] | None:
    """The decision-log mask rules that can reach into `/args` (those under it, and those that start
    with a wildcard), applied to what a judge is sent, so a field masked out of decision logs
    never reaches a model either. Nothing is added to the arguments (`upsert` sets only what is
    there): the model is shown the step as it was, less what is masked."""
    from kernel.decisionlog.mask import ANY_DEPTH, ANY_ONE, apply_masks, parse_mask_rules

    rules = tuple(r for r in parse_mask_rules(rules_text) if r.path[0] in ("args", ANY_ONE, ANY_DEPTH))
    if not rules:
        return None
    return lambda args: apply_masks({"input": {"args": args}}, rules, create=False)["input"].get("args")


def judge_hooks(judge: Any) -> list[Any]:
    """Close the judge's HTTP client with the app (it lives on the app's event loop)."""
    aclose = getattr(judge, "aclose", None)
    if aclose is None:
        return []

    async def hook(app: FastAPI) -> Any:
        return aclose

    return [hook]


def default_core_threads(dialect: str) -> int:
    """SQLite serialises writers, and under the GIL one thread running use cases back to back beats
    several handing off to each other; PostgreSQL statements wait on the network, so a few
    threads overlap those waits (bench/README.md, "The lane on PostgreSQL")."""
    return 1 if dialect == "sqlite" else 4


def shadow_runner(settings: Settings, kernel: Kernel, rego: Any) -> Any:
    """Shadow bundles' evaluator (kernel/shadow_runner.py), on Rego workers of its own (`rego`, a
    `LazyRegoEngine`), started now and set as the kernel's shadow observer."""
    from kernel.policy.shadow_eval import ShadowBundles
    from kernel.shadow_runner import ShadowRunner

    runner = ShadowRunner(kernel, ShadowBundles(kernel.store, rego), queue_size=settings.shadow_queue_size,
                          flush_interval=settings.shadow_flush_interval)
    runner.start()
    kernel.shadow = runner
    return runner


def mcp_gateway(settings: Settings, kernel: Kernel, manifest: Manifest | None, app: Any, token: str | None) -> Any:
    """`--mcp`: the MCP gateway of the manifest's `mcp:` agents on this app (kernel/mcp/inkernel.py)."""
    import functools
    from pathlib import Path

    from kernel.api.routes import agent
    from kernel.mcp.inkernel import Host, mount

    assert manifest is not None
    host_ = Host(submit=functools.partial(agent.submit, kernel, app.state.metrics),
                 outcome=functools.partial(agent.outcome, kernel, app.state.metrics))
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return mount(app, host_, manifest, kernel_url=f"http://{host}:{settings.port}", kernel_token=token,
                 pins_path=Path(settings.mcp_pins_file) if settings.mcp_pins_file else None)


def build_runtime(settings: Settings) -> Runtime:
    from kernel.api.app import create_app

    assert settings.db_url, "db_url is required"
    manifest = load_manifest(settings.config) if settings.config else None  # fail before the store opens
    if settings.mcp_in_kernel and (manifest is None or not any(a.mcp is not None for a in manifest.agents)):
        raise ConfigError("--mcp (REGENT_MCP_IN_KERNEL) serves the MCP gateway of the manifest's agents that have an "
                          "`mcp:` section: " + (f"{manifest.path} has none" if manifest else "there is no manifest"))
    from kernel.decisionlog import build_decision_log

    decision_log = build_decision_log(settings)  # a bad mask rule fails here too
    from kernel.bundle_puller import bundle_sources

    pulled = bundle_sources(settings, manifest)  # a bad bundle source too
    from kernel.ratelimit import LimitsLimiter

    judge = build_judge(settings, manifest, os.environ)  # a bad provider file fails before the store opens
    limiter = LimitsLimiter(settings.rate_limit_storage)  # a bad URI fails before the store opens
    store = open_store(
        settings.db_url, sqlite_synchronous=settings.sqlite_synchronous, pool_size=settings.db_pool_size
    )
    if settings.auto_migrate:
        migrate(store)
    from kernel import lane as threads

    groups = store.commit_groups() if settings.sqlite_group_commit else None
    lane = threads.configure(settings.core_threads or default_core_threads(store.dialect), groups)
    from kernel.policy.resolver import BundleResolver, LazyRegoEngine

    resolver = BundleResolver(
        store, rego=LazyRegoEngine(size=settings.rego_workers, timeout=settings.rego_timeout,
                                   spin_seconds=settings.rego_worker_spin_us / 1e6)
    )
    extra: dict[str, Any] = {"decision_log": decision_log} if decision_log is not None else {}
    hide_denied = frozenset(a.id for a in (manifest.agents if manifest else ())
                            if a.mcp is not None and a.mcp.hide_denied_tools)
    kernel = build_kernel(settings, store, policy=resolver, limiter=limiter, judge=judge,
                          pulled_bundles={s.agent_id: s.url for s in pulled}, mcp_hide_denied=hide_denied, **extra)
    # The shadows' workers are their own: a worker is never waited for (none idle is a fault).
    shadow_rego = LazyRegoEngine(size=settings.shadow_rego_workers, timeout=settings.rego_timeout,
                                 acquire_timeout=0.05, nice=settings.shadow_rego_nice,
                                 spin_seconds=settings.rego_worker_spin_us / 1e6)
    shadows = shadow_runner(settings, kernel, shadow_rego)
    if manifest is not None:
        try:
            provision(kernel, manifest)
        except BaseException:
            shadows.close()
            limiter.close()
            store.close()
            raise
    token = settings.bearer_token.get_secret_value() if settings.bearer_token else None
    hooks = (stream_hooks(settings, store) + background_hooks(settings, kernel) + decision_log_hooks(decision_log)
             + judge_hooks(judge) + bundle_hooks(kernel, pulled) + heap_hooks())
    app = create_app(
        kernel,
        bearer_token=token,
        dev=settings.dev,
        max_body_bytes=settings.max_body_bytes,
        signature_window_seconds=settings.signature_window_seconds,
        require_request_nonce=settings.require_request_nonce,
        replay_cache_size=settings.replay_cache_size,
        replay_shared=settings.replay_shared,
        lifespan_hooks=hooks,
    )
    if settings.mcp_in_kernel:
        hooks.append(mcp_gateway(settings, kernel, manifest, app, token))  # the lifespan reads `hooks` when it runs
    # The console is mounted here, beside the API rather than inside it: api/ does not know it exists.
    from kernel import console

    console.install(app, dev=settings.dev, bearer_token=token,
                    session_key=(settings.console_session_key.get_secret_value().encode()
                                 if settings.console_session_key else None),
                    session_ttl_seconds=settings.console_session_ttl)
    from kernel.api.metrics import RegoPoolCollector

    app.state.metrics_registry.register(RegoPoolCollector({"active": resolver.rego, "shadow": shadow_rego}))
    if decision_log is not None:
        from kernel.decisionlog import DecisionLogCollector

        app.state.metrics_registry.register(DecisionLogCollector(decision_log))
    app.state.stream_keepalive_seconds = settings.stream_keepalive_seconds
    return Runtime(settings, store, kernel, app, closers=[limiter.close, resolver.close, shadows.close], manifest=manifest,
                   lane=lane)
