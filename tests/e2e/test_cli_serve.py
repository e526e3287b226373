"""`regent dev` / `regent serve` as processes: start-up banner, the shipped dev manifest, refusing a
busy port, graceful shutdown on SIGTERM and SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, KernelProc, clean_env
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_dev_loads_the_shipped_manifest_and_prints_what_it_loaded(tmp_path: Path) -> None:
    port = free_port()
    k = KernelProc("dev", port, f"sqlite:///{tmp_path}/r.db", None, tmp_path / "dev.out")  # cwd: the repo
    k.stop_gracefully()
    out = " ".join(k.output().split())
    assert f"regent dev on http://127.0.0.1:{port}" in out
    assert f"store sqlite sqlite:///{tmp_path}/r.db" in out
    assert "config bundles/regent.yaml (2 agent(s) provisioned)" in out
    assert "agents hello, shell" in out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_dev_shuts_down_gracefully_on_a_signal(tmp_path: Path, sig: int) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text("agents: []\n")
    k = KernelProc("dev", free_port(), f"sqlite:///{tmp_path}/r.db", manifest, tmp_path / "dev.out")
    k.stop_gracefully(sig)
    assert "Application shutdown complete" in k.output()


def test_serve_refuses_a_port_already_in_use(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "kernel", "serve", "--port", str(port), "--db-url", f"sqlite:///{tmp_path}/r.db"],
            env=clean_env(REGENT_BEARER_TOKEN="t"), cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in " ".join(out.stderr.split())
