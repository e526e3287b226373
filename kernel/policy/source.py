"""Where the policy engines read stored bundles from: the store implements these; policy/ never imports it."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kernel.domain import Agent


@runtime_checkable
class BundleReads(Protocol):
    """One consistent read of stored bundles (the store's transaction, `Tx`)."""

    def active_policy_ref(self, agent_id: str) -> Any: ...
    def get_agent(self, agent_id: str) -> Agent | None: ...
    def policy_content(self, revision_id: int) -> str | None: ...
    def fork_bundle_ref(self, bundle_id: int) -> Any: ...
    def fork_bundle_content(self, bundle_id: int) -> str | None: ...
    def shadow_content(self, shadow_id: int) -> str | None: ...


@runtime_checkable
class BundleSource(Protocol):
    """Opens reads of stored bundles (the store, `SqlStore`)."""

    def read(self) -> AbstractContextManager[BundleReads]: ...
