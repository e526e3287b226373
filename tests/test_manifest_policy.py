"""The manifest binds bundles to agents: YAML files, inline text and Rego directories are stored
(compiled first); a bundle that does not compile fails the boot naming the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.core import policies
from kernel.core.kernel import Kernel
from kernel.errors import ConfigError
from kernel.manifest import load_manifest, provision
from kernel.policy.resolver import BundleResolver

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def governed(kernel: Kernel) -> Kernel:
    kernel.policy = BundleResolver(kernel.store)
    return kernel


def _manifest(tmp: Path, body: str) -> Path:
    p = tmp / "regent.yaml"
    p.write_text(body)
    return p


def test_default_manifest_stores_the_shell_bundle(governed: Kernel) -> None:
    provision(governed, load_manifest(ROOT / "bundles" / "regent.yaml"))
    active = policies.active_policy(governed, "shell")
    assert (active.kind, active.content) == ("yaml", (ROOT / "bundles" / "shell.yaml").read_text())
    provision(governed, load_manifest(ROOT / "bundles" / "regent.yaml"))  # every boot: no new revision
    assert len(policies.list_revisions(governed, "shell")) == 1


def test_rego_directory_and_inline_policy(governed: Kernel, tmp_path: Path) -> None:
    rego = ROOT / "bundles" / "shell-rego"
    p = _manifest(tmp_path, f"""agents:
  - id: a
    webhook_url: http://127.0.0.1:9/w
    secret: s
    policy_file: {rego}
  - id: b
    webhook_url: http://127.0.0.1:9/w
    secret: s
    policy: "default_action: allow\\n"
""")
    provision(governed, load_manifest(p))
    assert policies.active_policy(governed, "a").kind == "rego"
    assert policies.active_policy(governed, "b").content == "default_action: allow\n"
    governed.policy.close()  # type: ignore[attr-defined]


def test_bundle_that_does_not_compile_fails_the_boot(governed: Kernel, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("rules:\n  - id: x\n    then: {decision: perhaps}\n")
    p = _manifest(tmp_path, "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/w\n    secret: s\n    policy_file: bad.yaml\n")
    with pytest.raises(ConfigError, match=r"regent.yaml: agent 'a': .*bad.yaml.*line 3"):
        provision(governed, load_manifest(p))
