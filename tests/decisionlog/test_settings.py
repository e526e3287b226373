"""The decision log built from REGENT_ settings by the runtime: started with the app, counted in
/metrics; a bad mask rule stops the start with a message."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kernel.bootstrap import build_runtime
from kernel.config import Settings
from kernel.decisionlog import DecisionLog, FileSink, HttpSink, StdoutSink
from kernel.errors import ConfigError
from tests.support import ServerThread


def test_settings_build_every_sink_and_metrics_show_them(tmp_path: Path) -> None:
    s = Settings(db_url=f"sqlite:///{tmp_path}/r.db", decision_log_file=str(tmp_path / "d.jsonl"),
                 decision_log_console=True, decision_log_url="http://127.0.0.1:9/logs",
                 decision_log_mask="/args/password", decision_log_buffer_size=7)
    rt = build_runtime(s)
    try:
        dl = rt.kernel.decision_log
        assert isinstance(dl, DecisionLog)
        assert [type(x) for x in dl.sinks] == [FileSink, StdoutSink, HttpSink]
        assert dl.buffer_size == 7 and dl.masks[0].pointer == "/input/args/password"
        with ServerThread(rt.app) as srv:
            text = httpx.get(f"{srv.url}/metrics").text
        assert "regent_decision_log_entries_total 0.0" in text
        assert 'regent_decision_log_buffered{buffer="http"} 0.0' in text
    finally:
        rt.close()


def test_no_sink_means_no_decision_log(tmp_path: Path) -> None:
    rt = build_runtime(Settings(db_url=f"sqlite:///{tmp_path}/r.db"))
    try:
        assert rt.kernel.decision_log.enabled is False
    finally:
        rt.close()


def test_a_bad_mask_rule_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="args/password"):
        build_runtime(Settings(db_url=f"sqlite:///{tmp_path}/r.db", decision_log_console=True,
                               decision_log_mask="args/password"))
