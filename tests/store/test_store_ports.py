"""Each backend's store and transaction satisfy the small interfaces the layers above read them
through (mypy checks the same where bootstrap and the core hand them over)."""

from __future__ import annotations

from kernel.policy.source import BundleReads, BundleSource
from kernel.store import SqlStore


def test_the_store_is_a_bundle_source_and_its_reads_are_bundle_reads(store: SqlStore) -> None:
    assert isinstance(store, BundleSource)
    with store.read() as tx:
        assert isinstance(tx, BundleReads)
