"""Where pulled bundles are configured: `bundle:` in the provisioning manifest and the
REGENT_BUNDLE_* settings; and the runtime `regent serve` builds pulling one from a real bundle
server until /v0/ready says the agent's bundle is active."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from kernel.bootstrap import build_runtime
from kernel.bundle_puller import bundle_sources
from kernel.config import Settings
from kernel.core.policies import active_policy
from kernel.errors import ConfigError
from kernel.manifest import load_manifest
from tests.bundles.test_bundle_server import BundleServer, bundle
from tests.policy.signing_keys import keys_for
from tests.support import ServerThread

MANIFEST = """
agents:
  - id: payments
    webhook_url: http://127.0.0.1:9/hook
    secret: s3cret
    bundle:
      resource: /bundles/payments.tar.gz
      min_delay_seconds: 0.05
      max_delay_seconds: 0.1
      verification_key: release.pub.pem
      key_id: release
      scope: prod
  - id: other
    webhook_url: http://127.0.0.1:9/hook
    secret: s3cret
"""


def _manifest(tmp: Path, text: str = MANIFEST) -> Path:
    (tmp / "release.pub.pem").write_text(keys_for("RS256")[1])
    (tmp / "regent.yaml").write_text(text)
    return tmp / "regent.yaml"


def test_the_manifest_and_settings_make_the_sources(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path), env={})
    s = Settings(bundle_server_url="http://127.0.0.1:7000/", bundle_agents="other", bundle_min_delay=5,
                 bundle_max_delay=9)
    sources = {x.agent_id: x for x in bundle_sources(s, m)}
    assert sources["payments"].url == "http://127.0.0.1:7000/bundles/payments.tar.gz"
    assert (sources["payments"].min_delay, sources["payments"].max_delay) == (0.05, 0.1)
    (key,) = sources["payments"].keys
    assert (key.key_id, key.scope, key.algorithm) == ("release", "prod", "RS256")
    assert key.key.startswith("-----BEGIN PUBLIC KEY-----")
    assert sources["other"].url == "http://127.0.0.1:7000/bundles/other.tar.gz"
    assert (sources["other"].min_delay, sources["other"].max_delay, sources["other"].keys) == (5, 9, ())


def test_bundle_and_policy_together_are_refused_with_the_line(tmp_path: Path) -> None:
    text = MANIFEST.replace("    bundle:\n", "    policy: 'rules: []'\n    bundle:\n", 1)
    with pytest.raises(ConfigError, match=r"regent.yaml:\d+: agent 'payments': `bundle` and `policy`"):
        load_manifest(_manifest(tmp_path, text), env={})


def test_a_pulled_agent_needs_a_server_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="REGENT_BUNDLE_SERVER_URL"):
        bundle_sources(Settings(bundle_agents="payments"), None)
    with pytest.raises(ConfigError, match="max delay"):
        bundle_sources(Settings(bundle_server_url="http://x", bundle_agents="a", bundle_min_delay=5,
                                bundle_max_delay=1), None)


def test_the_served_runtime_pulls_and_activates_a_signed_bundle(tmp_path: Path) -> None:
    srv = BundleServer(tmp_path / "server")
    try:
        srv.publish(bundle(tmp_path, "from-the-server"))
        settings = Settings(db_url=f"sqlite:///{tmp_path}/r.db", config=str(_manifest(tmp_path)),
                            bundle_server_url=srv.url)
        rt = build_runtime(settings)
        try:
            with ServerThread(rt.app) as http:
                deadline = time.monotonic() + 30
                ready = httpx.get(f"{http.url}/v0/ready")
                while ready.status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
                    ready = httpx.get(f"{http.url}/v0/ready")
                assert ready.status_code == 200, ready.text
                assert ready.json()["details"]["bundles"]["payments"]["active_revision"] == "from-the-server"
                assert active_policy(rt.kernel, "payments").revision == "from-the-server"
                assert "regent_bundle_active{agent=\"payments\"} 1.0" in httpx.get(f"{http.url}/metrics").text
        finally:
            rt.close()
    finally:
        srv.stop()


def test_keys_by_key_id_from_the_manifest_and_the_settings(tmp_path: Path) -> None:
    """OPA's `keys` config: several keys by key id, shared (REGENT_BUNDLE_VERIFICATION_KEYS) and per
    agent (`bundle.keys`, which wins on the same id); the bundle's scope wins over a key's own."""
    (tmp_path / "r26.pub.pem").write_text(keys_for("RS256")[1])
    text = MANIFEST.replace(
        "      verification_key: release.pub.pem\n      key_id: release\n",
        "      key_id: release-2026\n      keys:\n        release-2026: {key: r26.pub.pem}\n"
        "        release-2027: {key: r27.pub.pem, algorithm: ES256, scope: ignored}\n")
    (tmp_path / "r27.pub.pem").write_text(keys_for("ES256")[1])
    m = load_manifest(_manifest(tmp_path, text), env={})
    shared = '{"ci-hmac": {"key": "a-shared-secret-of-32-bytes-or-more!!", "algorithm": "HS256"}, ' \
             '"release-2027": {"key": "overridden by the manifest"}}'
    s = Settings(bundle_server_url="http://127.0.0.1:7000", bundle_verification_keys=shared)
    (src,) = [x for x in bundle_sources(s, m) if x.agent_id == "payments"]
    keys = {k.key_id: k for k in src.keys}
    assert set(keys) == {"ci-hmac", "release-2026", "release-2027"}
    assert keys["release-2026"].algorithm == "RS256" and keys["release-2026"].key.startswith("-----BEGIN")
    assert keys["release-2027"].algorithm == "ES256" and keys["release-2027"].key == keys_for("ES256")[1]
    assert keys["ci-hmac"].algorithm == "HS256"
    assert {k.scope for k in src.keys} == {"prod"}
    assert src.default_key_id == "release-2026"


@pytest.mark.parametrize(
    ("value", "message"),
    [("not json", "not JSON"), ("[]", "JSON object"), ('{"k": {"algorithm": "RS256"}}', "must be"),
     ('{"k": {"key": "x", "kid": "y"}}', "must be")],
    ids=["not-json", "not-object", "no-key", "unknown-field"],
)
def test_bad_shared_keys_are_refused_at_start(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        bundle_sources(Settings(bundle_server_url="http://x", bundle_agents="a", bundle_verification_keys=value),
                       None)


def test_a_manifest_key_without_its_key_is_refused_with_the_line(tmp_path: Path) -> None:
    text = MANIFEST.replace("      key_id: release\n", "      keys:\n        release: {algorithm: RS256}\n")
    with pytest.raises(ConfigError, match=r"regent.yaml:\d+: .*`key` is required"):
        load_manifest(_manifest(tmp_path, text), env={})
