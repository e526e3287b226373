"""The manifest binds bundles to agents: YAML files, inline text and Rego directories are stored
(compiled first); a bundle that does not compile fails the boot naming the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.core import policies
from kernel.core.kernel import Kernel
from kernel.errors import ConfigError
from kernel.manifest import load_manifest, provision

ROOT = Path(__file__).resolve().parents[1]



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


def test_shadow_policy_file_and_inline_shadow_are_stored_once(governed: Kernel, tmp_path: Path) -> None:
    from kernel.core import shadow

    (tmp_path / "candidate.yaml").write_text("default_action: deny\n")
    p = _manifest(tmp_path, """agents:
  - id: a
    webhook_url: http://127.0.0.1:9/w
    secret: s
    policy: "default_action: allow\\n"
    shadow_policy_file: candidate.yaml
  - id: b
    webhook_url: http://127.0.0.1:9/w
    secret: s
    shadow_policy:
      default_action: deny
""")
    provision(governed, load_manifest(p))
    a = shadow.get_shadow(governed, "a")
    assert (a.kind, a.content, a.status, a.created_by) == ("yaml", "default_action: deny\n", "shadowing", str(p))
    assert shadow.get_shadow(governed, "b").content == "default_action: deny\n"
    provision(governed, load_manifest(p))  # every boot: the same shadow, its tallies kept
    assert shadow.get_shadow(governed, "a").id == a.id
    events = shadow.list_policy_events(governed, "a")
    assert [(e.type, e.credential) for e in events] == [("policy.shadow_set", "manifest"), ("policy.activated", "manifest")]


def test_shadow_policy_and_file_together_are_refused_with_the_line(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("default_action: deny\n")
    p = _manifest(tmp_path, "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/w\n    secret: s\n"
                            "    shadow_policy: 'default_action: deny'\n    shadow_policy_file: c.yaml\n")
    with pytest.raises(ConfigError, match=r"regent.yaml:6: agent 'a': `shadow_policy` and `shadow_policy_file` are mutually exclusive"):
        load_manifest(p)


def test_shadow_bundle_that_does_not_compile_fails_the_boot(governed: Kernel, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("rules:\n  - id: x\n    then: {decision: perhaps}\n")
    p = _manifest(tmp_path, "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/w\n    secret: s\n"
                            "    shadow_policy_file: bad.yaml\n")
    with pytest.raises(ConfigError, match=r"regent.yaml: agent 'a': .*bad.yaml.*line 3"):
        provision(governed, load_manifest(p))
