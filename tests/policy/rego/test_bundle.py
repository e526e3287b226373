"""Bundle loading: directory, tarball and mapping; manifest fields; revision; size; unsafe tars."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from kernel.domain.decision import Verdict
from kernel.errors import ValidationError
from kernel.policy.rego import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    load_rego_bundle,
    parse_rego_bundle,
    parse_rego_tarball,
)

POLICY = 'package shell\nimport rego.v1\n\ndecision := {"decision": "allow", "rule_id": "a"}\n'
MANIFEST = {
    "revision": "2026-12-01.1",
    "roots": ["shell"],
    "metadata": {"regent": {"default_action": "allow"}},
}


def write_bundle(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".manifest").write_text(json.dumps(MANIFEST))
    (root / "policy.rego").write_text(POLICY)
    (root / "policy_test.rego").write_text("package shell_test\nthis is not even rego\n")
    (root / "README.md").write_text("ignored")
    (root / "shell" / "limits").mkdir(parents=True)
    (root / "shell" / "limits" / "data.json").write_text('{"max": 5}')
    (root / "shell" / "data.yaml").write_text("allowed:\n  - ls\n")
    return root


def tarball(files: dict[str, bytes | str], *, kinds: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            raw = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        for name, kind in (kinds or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return buf.getvalue()


def test_directory_bundle_loads_manifest_modules_and_data(tmp_path: Path) -> None:
    b = load_rego_bundle(write_bundle(tmp_path / "shell"))
    assert b.revision == "2026-12-01.1"
    assert b.roots == ("shell",)
    assert b.entrypoint == "shell/decision"
    assert b.default_action == Verdict.ALLOW
    assert list(b.modules) == ["policy.rego"]  # *_test.rego and other files skipped
    assert b.data == {"shell": {"allowed": ["ls"], "limits": {"max": 5}}}
    assert b.display_path("policy.rego") == str(tmp_path / "shell" / "policy.rego")


def test_tarball_of_a_directory_equals_the_directory(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "shell")
    archive = tmp_path / "shell.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="shell")
    from_dir, from_tar = load_rego_bundle(root), load_rego_bundle(archive)
    assert from_tar.modules == from_dir.modules
    assert from_tar.data == from_dir.data
    assert from_tar.digest == from_dir.digest
    assert from_tar.display_path("policy.rego") == "policy.rego"


def test_tarball_with_files_at_top_level_loads() -> None:
    b = parse_rego_tarball(tarball({"./.manifest": json.dumps(MANIFEST), "./policy.rego": POLICY}))
    assert list(b.modules) == ["policy.rego"]


def test_mapping_bundle_digest_matches_directory(tmp_path: Path) -> None:
    from_dir = load_rego_bundle(write_bundle(tmp_path / "shell"))
    mapping = parse_rego_bundle(
        {"modules": dict(from_dir.modules), "data": from_dir.data, "manifest": MANIFEST}
    )
    assert mapping.digest == from_dir.digest


def test_bundles_with_the_same_content_are_equal_and_hashable() -> None:
    a = parse_rego_bundle({"modules": {"p.rego": POLICY}, "manifest": {"roots": ["shell"]}})
    b = parse_rego_bundle({"modules": {"p.rego": POLICY}, "manifest": {"roots": ["shell"]}})
    assert a == b and len({a, b}) == 1


def test_revision_defaults_to_content_digest() -> None:
    a = parse_rego_bundle({"modules": {"p.rego": POLICY}, "manifest": {"roots": ["shell"]}})
    b = parse_rego_bundle({"modules": {"p.rego": POLICY + "\n"}, "manifest": {"roots": ["shell"]}})
    assert a.revision == a.digest and len(a.digest) == 64
    assert a.digest != b.digest


def test_entrypoint_from_manifest_is_used() -> None:
    b = parse_rego_bundle(
        {
            "modules": {"p.rego": POLICY},
            "manifest": {
                "roots": ["shell", "lib"],
                "metadata": {"regent": {"entrypoint": "shell/main"}},
            },
        }
    )
    assert b.entrypoint == "shell/main"
    assert b.default_action == Verdict.DENY


@pytest.mark.parametrize(
    "manifest",
    [{"roots": ["shell", "lib"]}, {"roots": [""]}],
    ids=["two roots", "empty root"],
)
def test_entrypoint_required_without_exactly_one_root(manifest: dict) -> None:
    with pytest.raises(ValidationError, match="entrypoint is required"):
        parse_rego_bundle({"modules": {"p.rego": POLICY}, "manifest": manifest})


def test_a_bundle_without_a_manifest_is_rooted_at_its_modules_package() -> None:
    b = parse_rego_bundle({"modules": {"p.rego": POLICY, "q.rego": "package shell.lib\n"}})
    assert (b.roots, b.entrypoint) == (("shell",), "shell/decision")
    with pytest.raises(ValidationError, match="top-level package as its root when they all share one"):
        parse_rego_bundle({"modules": {"p.rego": POLICY, "q.rego": "package lib\n"}})


MANIFEST_PROBLEMS = [
    (
        "default_action",
        {"roots": ["s"], "metadata": {"regent": {"default_action": "require_approval"}}},
        "default_action",
    ),
    (
        "unknown regent key",
        {"roots": ["s"], "metadata": {"regent": {"defaultaction": "allow"}}},
        "metadata.regent.defaultaction",
    ),
    ("unknown manifest key", {"roots": ["s"], "rootz": []}, "unknown key 'rootz'"),
    ("roots type", {"roots": "s"}, "roots must be a list"),
    ("revision type", {"roots": ["s"], "revision": 3}, "revision must be a string"),
    (
        "bad entrypoint",
        {"roots": ["s"], "metadata": {"regent": {"entrypoint": "s.decision"}}},
        "must be a rule path",
    ),
    ("rego v0", {"roots": ["s"], "rego_version": 0}, "Rego v1"),
]


@pytest.mark.parametrize(
    ("manifest", "part"), [c[1:] for c in MANIFEST_PROBLEMS], ids=[c[0] for c in MANIFEST_PROBLEMS]
)
def test_bad_manifest_is_rejected(manifest: dict, part: str) -> None:
    with pytest.raises(ValidationError, match="invalid policy bundle") as info:
        parse_rego_bundle({"modules": {"p.rego": POLICY}, "manifest": manifest})
    assert part in info.value.message


def test_every_problem_is_listed_one_per_line() -> None:
    with pytest.raises(ValidationError) as info:
        parse_rego_bundle(
            {
                "modules": {"p.rego": POLICY, "q.txt": "x"},
                "manifest": {"roots": ["s"], "revision": 3},
            }
        )
    lines = info.value.message.splitlines()
    assert lines[0].startswith("invalid policy bundle: ")
    assert len(lines) == 2


def test_oversize_bundle_is_rejected() -> None:
    big = POLICY + "# " + "x" * MAX_BUNDLE_BYTES + "\n"
    with pytest.raises(ValidationError, match="larger than"):
        parse_rego_bundle({"modules": {"p.rego": big}, "manifest": {"roots": ["shell"]}})


def test_oversize_directory_is_rejected(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "b")
    (root / "blob.bin").write_bytes(b"\0" * (MAX_BUNDLE_BYTES + 1))
    with pytest.raises(ValidationError, match="larger than"):
        load_rego_bundle(root)


def test_symlink_in_directory_is_rejected(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "b")
    (root / "evil.rego").symlink_to("/etc/hostname")
    with pytest.raises(ValidationError, match="symlinks are not allowed"):
        load_rego_bundle(root)


MALICIOUS = [
    ("absolute path", {"/etc/cron.d/x.rego": POLICY}, None, "absolute paths"),
    ("dot-dot", {"../../x.rego": POLICY}, None, "escapes the bundle"),
    ("nested dot-dot", {"a/../../x.rego": POLICY}, None, "escapes the bundle"),
    ("symlink", {"p.rego": POLICY}, {"link.rego": tarfile.SYMTYPE}, "links and special files"),
    ("hard link", {"p.rego": POLICY}, {"hard.rego": tarfile.LNKTYPE}, "links and special files"),
    ("device", {"p.rego": POLICY}, {"dev": tarfile.CHRTYPE}, "links and special files"),
    ("fifo", {"p.rego": POLICY}, {"fifo": tarfile.FIFOTYPE}, "links and special files"),
]


@pytest.mark.parametrize(
    ("files", "kinds", "part"), [c[1:] for c in MALICIOUS], ids=[c[0] for c in MALICIOUS]
)
def test_malicious_tarball_is_rejected(files: dict, kinds: dict | None, part: str) -> None:
    with pytest.raises(ValidationError, match=part):
        parse_rego_tarball(tarball({".manifest": json.dumps(MANIFEST), **files}, kinds=kinds))


def test_tarball_with_too_many_members_is_rejected() -> None:
    files = {f"d/{i}.txt": "" for i in range(MAX_BUNDLE_FILES + 1)}
    with pytest.raises(ValidationError, match="more than"):
        parse_rego_tarball(tarball({".manifest": json.dumps(MANIFEST), **files}))


def test_tarball_that_expands_too_far_is_rejected() -> None:
    bomb = tarball({".manifest": json.dumps(MANIFEST), "blob": b"\0" * (MAX_BUNDLE_BYTES + 10)})
    assert len(bomb) < 64 * 1024  # compresses to almost nothing
    with pytest.raises(ValidationError, match=r"larger than|expands past"):
        parse_rego_tarball(bomb)


def test_garbage_tarball_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"not a readable tarball|not a gzip"):
        parse_rego_tarball(b"\x1f\x8bnot really gzip")


def test_a_corrupted_tarball_is_always_a_bundle_error() -> None:
    # A gzip header over corrupt deflate data raised zlib.error (a 500 on upload); 2 000 seeded
    # mutations of a good bundle, gzipped and plain, each either load or are a ValidationError.
    import gzip
    import random

    good = tarball({".manifest": json.dumps(MANIFEST), "policy.rego": POLICY})
    rnd = random.Random(5)
    refused = 0
    for i in range(2000):
        data = bytearray(good if i % 2 else gzip.decompress(good))
        for _ in range(rnd.randint(1, 8)):
            p = rnd.randrange(len(data))
            if rnd.random() < 0.7:
                data[p] = rnd.randrange(256)
            else:
                del data[p:p + rnd.randint(1, 64)]
        try:
            parse_rego_tarball(bytes(data))
        except ValidationError:
            refused += 1  # anything else fails the test
    assert refused > 1000  # nearly every mutation breaks the bundle, each as a bundle error


def test_data_conflict_between_files_is_rejected(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "b")
    (root / "data.json").write_text('{"shell": {"limits": 3}}')
    with pytest.raises(ValidationError, match=r"defined twice|conflicts"):
        load_rego_bundle(root)


def test_unparseable_data_file_is_rejected(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "b")
    (root / "data.json").write_text("{nope")
    with pytest.raises(ValidationError, match=r"data\.json: cannot be parsed"):
        load_rego_bundle(root)


def test_module_with_nul_is_rejected() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        parse_rego_bundle(
            {"modules": {"p.rego": POLICY + "\x00"}, "manifest": {"roots": ["shell"]}}
        )
