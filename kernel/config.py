"""Settings: one pydantic-settings class, env prefix REGENT_. Built once by the CLI, passed down.

Every field is documented in docs/configuration.md. Durations accept seconds (`30`, `0.25`) or Go
duration strings (`30s`, `5m`, `1h30m`).
"""

from __future__ import annotations

import socket
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernel.duration import DurationError, parse_duration


def seconds(value: Any) -> float:
    """Seconds from a number or a Go duration string (kernel/duration.py, without a sign);
    negative values are refused."""
    if isinstance(value, int | float):
        out = float(value)
    else:
        text = str(value).strip()
        try:
            out = float(text)
        except ValueError:
            if text in ("0", ""):
                return 0.0
            try:
                if text[:1] in ("+", "-"):  # a signed number reads as one (above); a signed duration never
                    raise DurationError(text)
                out = parse_duration(text)
            except DurationError:
                raise ValueError(f"not a duration: {value!r} (use seconds or e.g. 30s, 5m, 1h30m)") from None
    if out < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    return out


_DURATIONS = (
    "dispatch_base_delay",
    "dispatch_max_delay",
    "dispatch_timeout",
    "dispatch_lease_timeout",
    "dispatch_poll_interval",
    "dispatch_breaker_reset",
    "approval_timeout",
    "cleanup_interval",
    "deadline_check_interval",
    "retention",
    "decision_retention",
    "decision_flush_interval",
    "shadow_retention",
    "rego_timeout",
    "agent_cache_ttl",
    "console_session_ttl",
    "decision_log_flush_interval",
    "decision_log_timeout",
    "decision_log_retry_min_delay",
    "decision_log_retry_max_delay",
    "bundle_min_delay",
    "bundle_max_delay",
    "bundle_timeout",
    "judge_timeout",
    "judge_breaker_reset",
    "shadow_flush_interval",
    "request_read_timeout",
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REGENT_", extra="ignore")

    # Serving
    host: str = "127.0.0.1"
    port: int = 8080
    db_url: str | None = None
    bearer_token: SecretStr | None = None
    dev: bool = False
    config: str | None = None
    replica_id: str = Field(default_factory=lambda: socket.gethostname())
    auto_migrate: bool = True
    log_level: str = "info"

    # Storage
    sqlite_synchronous: str = "full"
    # The lane's use cases share one commit (one fsync) while more of them wait (docs/architecture.md)
    sqlite_group_commit: bool = True
    # On SQLite, a step call that finds the kernel idle runs on the event loop, not the lane
    # (docs/architecture.md, "Calls on the event loop")
    sqlite_inline_idle_calls: bool = True
    db_pool_size: int = 10

    # The MCP gateway in this process, under /mcp-gateway (`--mcp`; docs/mcp.md, "In the kernel's
    # process"): its pin file (the last approvals the kernel answered), as `regent mcp serve` reads it
    mcp_in_kernel: bool = False
    mcp_pins_file: str | None = None

    # Requests
    max_body_bytes: int = 10 * 1024 * 1024
    # Each request must arrive whole (line, headers, body) within this long of its connection
    # opening or of the previous response; else the connection is closed (0 = no deadline;
    # kernel/api/transport.py)
    request_read_timeout: float = 30.0
    signature_window_seconds: int = 300
    # Refuse signed agent mutations without a Rebuno-Nonce (the official SDK sends none; docs/api.md)
    require_request_nonce: bool = False
    # Signed mutations a replica remembers to refuse their replay; when full, the oldest is dropped
    # and the accepted window narrows (fail closed; docs/api.md, Replayed requests)
    replay_cache_size: int = Field(default=200_000, ge=1, le=10_000_000)
    # PostgreSQL: the replicas share the record of signed mutations (a table); false keeps it per
    # replica in memory (enough for one replica; saves a statement per guarded mutation)
    replay_shared: bool = True
    # Comment frames on an idle GET /v0/executions/{id}/stream, so proxies keep it open
    stream_keepalive_seconds: float = Field(default=15.0, gt=0)
    # How long a replica keeps an agent's secret after reading it for a signature check
    # (0 = read it on every request). Changes made on this replica apply at once.
    agent_cache_ttl: float = 1.0
    # Threads that run the core use cases back to back (kernel/lane.py); unset: 1 on
    # SQLite (one writer per file anyway), 4 on PostgreSQL (statements wait on the network)
    core_threads: int | None = Field(default=None, ge=1, le=64)

    # Dispatch
    dispatch_max_attempts: int = 5
    dispatch_base_delay: float = 1.0
    dispatch_max_delay: float = 30.0
    dispatch_timeout: float = 30.0
    # Webhooks in flight at once per replica, and the most rows claimed ahead of them
    dispatch_concurrency: int = Field(default=64, ge=1, le=1024)
    dispatch_lease_timeout: float = 120.0
    dispatch_poll_interval: float = 0.25
    # Of those, at most this many to one agent, and to one webhook host (scheme, host, port);
    # unset: half of dispatch_concurrency, so no agent or host can take every slot
    dispatch_agent_concurrency: int | None = Field(default=None, ge=1, le=1024)
    dispatch_host_concurrency: int | None = Field(default=None, ge=1, le=1024)
    # After this many failed deliveries in a row an agent is sent nothing for dispatch_breaker_reset
    # (doubling per failed probe, up to dispatch_max_delay); its executions wait, attempts unspent
    dispatch_breaker_failures: int = Field(default=5, ge=1)
    dispatch_breaker_reset: float = 5.0
    # Admission control: POST /v0/executions answers 503 with Retry-After while this many
    # dispatches wait undelivered (0 = no bound)
    max_backlog: int = Field(default=10_000, ge=0)

    # Approvals, sweeps
    approval_timeout: float = 900.0
    cleanup_interval: float = 600.0
    deadline_timeout: float | None = None
    deadline_check_interval: float = 30.0
    retention: float = 86400.0
    # The decisions table's own retention (docs/audit.md), independent of executions'; 0 = for ever
    decision_retention: float = 90 * 86400.0
    # How often the decision journal is moved into the indexed decisions table (docs/audit.md)
    decision_flush_interval: float = Field(default=1.0, gt=0)
    # Write the durable decisions table on every decision (off only to measure what it costs)
    record_decisions: bool = True
    # May the bootstrap token grant/deny approvals (the decider then is only asserted)?
    bootstrap_approvals: bool = True
    leader_lock_key: str = "regent_scheduler_leader"

    # Policy
    rego_timeout: float = 0.25
    rego_workers: int = 2
    # How long (µs) a Rego worker polls for the next request after a reply before it blocks; 0 = off.
    rego_worker_spin_us: int = Field(default=200, ge=0, le=100_000)
    # Shadow bundles (docs/policy-rollout.md): Rego workers of their own, so a slow or crashing
    # shadow never takes a worker from the active bundles; a bounded queue (full: counted as
    # dropped); how often tallies and disagreements are written.
    shadow_rego_workers: int = Field(default=1, ge=1, le=16)
    # How much lower the shadow workers' CPU priority is than the kernel's (nice increment):
    # their start-ups and evaluations yield the CPU to the active path
    shadow_rego_nice: int = Field(default=19, ge=0, le=19)
    # Shadow disagreement rows older than this are deleted by the cleanup sweep; the tallies
    # (counts) are kept. 0 = for ever
    shadow_retention: float = 90 * 86400.0
    shadow_queue_size: int = Field(default=10_000, ge=1)
    shadow_flush_interval: float = 0.5

    # Rate limits
    rate_limit_storage: str = "memory://"

    # Console (/console): the key that signs session cookies (unset: a new one per process, so a
    # restart signs everyone out and replicas do not share sessions) and how long a session lasts
    console_session_key: SecretStr | None = None
    console_session_ttl: float = 8 * 3600.0
    # Judge (the `judge` decision's model; docs/judge.md)
    judge_provider: str | None = None  # provider file; the manifest may name one per agent
    # Upstream's configuration: an API key alone gives the built-in TypeSafe provider (a provider
    # file wins); REBUNO_TYPESAFE_API_KEY, upstream's variable, is read when this is unset.
    judge_api_key: SecretStr | None = None
    judge_url: str = "https://api.typesafe.ai/v1/systemone"
    judge_timeout: float = Field(default=5.0, gt=0)
    judge_concurrency: int = Field(default=8, ge=1, le=1024)
    judge_breaker_failures: int = Field(default=5, ge=1)
    judge_breaker_reset: float = 30.0

    # Decision logs (docs/policy-rollout.md): off unless a sink is set
    decision_log_file: str | None = None
    decision_log_file_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    decision_log_file_backups: int = Field(default=5, ge=0)
    decision_log_console: bool = False
    decision_log_url: str | None = None
    decision_log_token: SecretStr | None = None
    decision_log_buffer_size: int = Field(default=10_000, ge=1)
    decision_log_batch_size: int = Field(default=500, ge=1)
    decision_log_flush_interval: float = 1.0
    decision_log_timeout: float = 10.0
    decision_log_retry_min_delay: float = 0.5
    decision_log_retry_max_delay: float = 30.0
    decision_log_mask: str | None = None

    # Bundles pulled from a bundle server (docs/policy-rollout.md)
    bundle_server_url: str | None = None
    bundle_agents: str | None = None
    bundle_server_token: SecretStr | None = None
    bundle_min_delay: float = 60.0
    bundle_max_delay: float = 120.0
    bundle_timeout: float = 10.0
    bundle_verification_key: str | None = None
    bundle_verification_key_id: str | None = None
    bundle_verification_algorithm: str = "RS256"
    bundle_verification_scope: str | None = None
    # Several keys by key id, in OPA's `keys` shape as JSON: {"<kid>": {"key": …, "algorithm": …, "scope": …}}
    bundle_verification_keys: str | None = None

    @field_validator(*_DURATIONS, mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return seconds(v)

    @field_validator("deadline_timeout", mode="before")
    @classmethod
    def _optional_duration(cls, v: Any) -> float | None:
        if v is None or v == "":
            return None
        return seconds(v) or None
