"""What start-up built is kept out of the collector's full passes while the app serves."""

from __future__ import annotations

import gc
from pathlib import Path

from starlette.testclient import TestClient

from kernel.bootstrap import build_runtime
from kernel.config import Settings


def test_the_start_up_heap_is_frozen_while_serving_and_thawed_after(tmp_path: Path) -> None:
    rt = build_runtime(Settings(db_url=f"sqlite:///{tmp_path}/k.db", dev=True))
    try:
        assert gc.get_freeze_count() == 0
        with TestClient(rt.app) as client:
            # Every object start-up made sits in the permanent generation: a full collection
            # (which held every request for 40-80 ms) no longer walks them.
            assert gc.get_freeze_count() > 10_000
            assert client.get("/v0/health").status_code == 200
        assert gc.get_freeze_count() == 0
    finally:
        rt.close()
