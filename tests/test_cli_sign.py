"""`regent policy sign` and `regent policy check --verify-key`: exit 0 on a good signature, 1 with
the file and the reason on a refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.cli import main
from tests.policy.signing_keys import copy_bundle, keys_for


def _keys(tmp: Path, alg: str = "RS256") -> tuple[str, str]:
    priv, pub = keys_for(alg)
    if alg.startswith("HS"):
        return priv, pub
    (tmp / "priv.pem").write_text(priv)
    (tmp / "pub.pem").write_text(pub)
    return str(tmp / "priv.pem"), str(tmp / "pub.pem")


@pytest.mark.parametrize("alg", ["RS256", "ES256", "HS256"])
def test_sign_then_check_with_the_verification_key(tmp_path: Path, alg: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bundle = copy_bundle(tmp_path)
    priv, pub = _keys(tmp_path, alg)
    assert main(["policy", "sign", str(bundle), "--signing-key", priv, "--signing-alg", alg,
                 "--key-id", "release", "--scope", "prod"]) == 0
    doc = json.loads((bundle / ".signatures.json").read_text())
    assert len(doc["signatures"]) == 1
    assert main(["policy", "check", str(bundle), "--verify-key", pub, "--verify-alg", alg,
                 "--key-id", "release", "--scope", "prod"]) == 0
    assert "ok" in capsys.readouterr().out


def test_check_refuses_a_tampered_bundle_naming_file_and_reason(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    bundle = copy_bundle(tmp_path)
    priv, pub = _keys(tmp_path)
    assert main(["policy", "sign", str(bundle), "--signing-key", priv]) == 0
    (bundle / "data.json").write_text('{"payments": {}}')
    assert main(["policy", "check", str(bundle), "--verify-key", pub]) == 1
    err = capsys.readouterr().err
    assert "digest_mismatch" in err and "data.json" in err


def test_check_with_a_key_refuses_an_unsigned_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = copy_bundle(tmp_path)
    _, pub = _keys(tmp_path)
    assert main(["policy", "check", str(bundle), "--verify-key", pub]) == 1
    assert "signature_missing" in capsys.readouterr().err
    assert main(["policy", "check", str(bundle)]) == 0  # without a key: the load gate only


def test_sign_with_an_unusable_key_exits_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = copy_bundle(tmp_path)
    (tmp_path / "bad.pem").write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    assert main(["policy", "sign", str(bundle), "--signing-key", str(tmp_path / "bad.pem")]) == 1
    assert "cannot sign" in capsys.readouterr().err
    assert not (bundle / ".signatures.json").exists()


def test_a_yaml_bundle_signed_in_its_directory_checks_and_a_change_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The release flow docs/policy-rollout.md gives for YAML bundles pulled from a bundle server:
    sign the directory holding the one YAML file, check it with the key, then tar it."""
    priv, pub = keys_for("RS256")
    d = tmp_path / "payments"
    d.mkdir()
    root = Path(__file__).resolve().parents[1]
    (d / "payments.yaml").write_text((root / "bundles" / "payments.yaml").read_text())
    assert main(["policy", "sign", str(d), "--signing-key", priv, "--key-id", "release"]) == 0
    assert main(["policy", "check", str(d), "--verify-key", pub, "--key-id", "release"]) == 0
    (d / "payments.yaml").write_text((d / "payments.yaml").read_text().replace("max_calls: 30", "max_calls: 3000"))
    capsys.readouterr()
    assert main(["policy", "check", str(d), "--verify-key", pub, "--key-id", "release"]) == 1
    assert "digest_mismatch" in capsys.readouterr().err
    bare = tmp_path / "bare.yaml"
    bare.write_text("rules: []\n")
    assert main(["policy", "check", str(bare), "--verify-key", pub]) == 1
    assert "carries no signature" in capsys.readouterr().err


def test_a_signed_yaml_bundle_tarball_checks_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a bundle server serves for a YAML bundle: its directory tarred, `.signatures.json` beside
    the one YAML file. `check` verifies it and runs the YAML load gate, lints included."""
    import tarfile

    priv, pub = keys_for("RS256")
    d = tmp_path / "payments"
    d.mkdir()
    (d / "payments.yaml").write_text(
        "default_action: deny\nrules:\n  - id: ls\n    when: {target: shell, arguments: {command: {regex: ls}}}\n"
        "    then: {decision: allow}\n")
    assert main(["policy", "sign", str(d), "--signing-key", priv, "--key-id", "release"]) == 0
    tgz = tmp_path / "payments.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(d, arcname="payments")
    capsys.readouterr()
    assert main(["policy", "check", str(tgz), "--verify-key", pub, "--key-id", "release", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["bundles"]
    assert row["kind"] == "yaml" and [w["code"] for w in row["warnings"]] == ["unanchored-regex"]
    (d / "payments.yaml").write_text((d / "payments.yaml").read_text().replace("deny", "allow", 1))
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(d, arcname="payments")
    assert main(["policy", "check", str(tgz), "--verify-key", pub, "--key-id", "release"]) == 1
    assert "digest_mismatch" in capsys.readouterr().err
