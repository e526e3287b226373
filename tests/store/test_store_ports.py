"""Each backend's store and transaction satisfy the small interfaces the layers above read them
through (mypy checks the same where bootstrap and the core hand them over)."""

from __future__ import annotations

from kernel.core.store_ports import STORE_PARTS, Store, Transaction
from kernel.policy.source import BundleReads, BundleSource
from kernel.store import SqlStore


def test_the_store_is_a_bundle_source_and_its_reads_are_bundle_reads(store: SqlStore) -> None:
    assert isinstance(store, BundleSource)
    with store.read() as tx:
        assert isinstance(tx, BundleReads)


def test_a_transaction_is_every_store_part_the_core_names(store: SqlStore) -> None:
    with store.read() as tx:
        missing = [part.__name__ for part in STORE_PARTS if not isinstance(tx, part)]
    assert missing == []
    assert len(STORE_PARTS) == 8


def test_the_store_is_what_the_core_opens_and_its_transactions_have_every_part(store: SqlStore) -> None:
    assert isinstance(store, Store)
    with store.transaction() as tx:
        assert isinstance(tx, Transaction)
