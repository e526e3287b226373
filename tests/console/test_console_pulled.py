"""A pulled agent's policies page in a real Chromium: it names the bundle server, offers no upload,
re-activation or promotion, and credits the pulled revision to the source URL
(docs/policy-rollout.md, "Pulled agents")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel.bootstrap import build_runtime
from kernel.config import Settings
from tests.bundles.test_bundle_server import BundleServer, bundle
from tests.bundles.test_config import _manifest
from tests.console.conftest import shot
from tests.console.test_console_serve import sign_in
from tests.support import ServerThread

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
TOKEN = "pulled-console-bootstrap"


@pytest.fixture(scope="module")
def pulled_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("console-pulled")
    srv = BundleServer(tmp / "server")
    try:
        srv.publish(bundle(tmp, "r1"))
        settings = Settings(db_url=f"sqlite:///{tmp}/r.db", config=str(_manifest(tmp)), bundle_server_url=srv.url,
                            bearer_token=TOKEN)
        rt = build_runtime(settings)
        try:
            with ServerThread(rt.app) as http:
                deadline = time.monotonic() + 30
                while httpx.get(f"{http.url}/v0/ready").status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                auth = {"Authorization": f"Bearer {TOKEN}"}
                r = httpx.put(f"{http.url}/v0/policies/payments/shadow", headers=auth,
                              json={"bundle": "default_action: allow\nrules: []\n"})
                assert r.status_code == 200, r.text
                yield http.url, f"{srv.url}/bundles/payments.tar.gz"
        finally:
            rt.close()
    finally:
        srv.stop()


def test_a_pulled_agents_page_names_its_source_and_offers_no_change(pulled_kernel: tuple[str, str],
                                                                     page: Any) -> None:
    url, source = pulled_kernel
    sign_in(page, url, TOKEN, "/console/policies?agent_id=payments")
    page.locator("#pulled-from").wait_for()
    assert source in page.locator("#pulled-from").inner_text()
    assert page.locator("#shadow-report").count() == 1  # the shadow's report is still there
    for action in ("Re-activate", "Check and activate", "Promote to active…"):
        assert page.locator(f"text={action}").count() == 0, action
    row = page.locator("#revision-1")
    assert source in row.locator(".stored-by").inner_text() and "bundle_pull" in row.locator(".stored-by").inner_text()
    shot(page, "policies-pulled")
    # The confirmation page itself refuses too, naming the source: the bundle server decides.
    response = page.goto(f"{url}/console/policies/payments/promote")
    assert response.status == 409 and page.locator("#promote-confirm").count() == 0
    assert source in page.locator("main").inner_text()
