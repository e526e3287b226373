"""Wiring: Settings → store, policy resolver, limiter, kernel, app. The one place that picks
concrete classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from kernel.config import Settings
from kernel.core.kernel import Kernel
from kernel.store import SqlStore, open_store
from kernel.store.migrations import migrate


@dataclass
class Runtime:
    settings: Settings
    store: SqlStore
    kernel: Kernel
    app: FastAPI
    closers: list[Any] = field(default_factory=list)

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
        **overrides,
    )


def build_runtime(settings: Settings) -> Runtime:
    from kernel.api.app import create_app

    assert settings.db_url, "db_url is required"
    store = open_store(
        settings.db_url, sqlite_synchronous=settings.sqlite_synchronous, pool_size=settings.db_pool_size
    )
    if settings.auto_migrate:
        migrate(store)
    from kernel.policy.resolver import BundleResolver

    kernel = build_kernel(settings, store, policy=BundleResolver(store))
    token = settings.bearer_token.get_secret_value() if settings.bearer_token else None
    app = create_app(
        kernel,
        bearer_token=token,
        dev=settings.dev,
        max_body_bytes=settings.max_body_bytes,
        signature_window_seconds=settings.signature_window_seconds,
    )
    return Runtime(settings, store, kernel, app)
