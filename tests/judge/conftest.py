"""A real judge provider process on loopback, and a kernel whose agent's bundle asks it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.core.kernel import Kernel
from kernel.judge import HttpJudge, JudgeLimits, load_provider
from kernel.policy.resolver import BundleResolver
from tests.support import free_port

HERE = Path(__file__).parent
PROVIDER = HERE / "provider.yaml"
BUNDLE = """\
default_action: deny
rules:
  - id: ask-model
    when: {target: send_email}
    then:
      decision: judge
      judge:
        instructions: Does this email leak customer data?
        threshold: 0.6
      approval_config: {approvers: [alice], message: the model was unsure}
  - id: ask-model-strict
    when: {target: wire_funds}
    then:
      decision: judge
      judge: {fallback: deny}
  - id: allow-read
    when: {target: read_*}
    then: {decision: allow}
"""


class JudgeServer:
    def __init__(self, url: str):
        self.url = url

    def set(self, mode: str = "ok", probabilities: dict[str, float] | None = None, delay: float = 0.0) -> None:
        body = {"mode": mode, "probabilities": probabilities or {"allow": 0.9}, "delay": delay}
        httpx.post(f"{self.url}/control", json=body, timeout=5).raise_for_status()

    def received(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/received", timeout=5).json())


@pytest.fixture(scope="session")
def judge_server() -> Iterator[JudgeServer]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "judge_server.py"), str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                httpx.get(f"{url}/received", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the test judge server did not start") from None
                time.sleep(0.05)
        yield JudgeServer(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def make_judge(url: str, **limits: Any) -> HttpJudge:
    provider = load_provider(PROVIDER, {"JUDGE_URL": url, "JUDGE_TEST_KEY": "test-key-123"})
    return HttpJudge(provider, limits=JudgeLimits(**{"timeout_seconds": 2.0, **limits}))


@pytest.fixture
def judged(kernel: Kernel, judge_server: JudgeServer) -> Kernel:
    judge_server.set()
    kernel.policy = BundleResolver(kernel.store)
    kernel.judge = make_judge(judge_server.url)
    return kernel
