"""YAML from outside with its aliases' expansion bounded (kernel/yamldoc.py): a billion laughs in
a case file, a bundle's data.yaml or its signature check is a clear refusal, cheaply; ordinary
documents, aliases included, load as before."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc

import pytest

from kernel.errors import ValidationError
from kernel.policy.cases import parse_cases
from kernel.policy.rego import parse_rego_tarball
from kernel.policy.signature import hashed_bytes
from kernel.yamldoc import MAX_EXPANDED_NODES, YamlTooLarge, safe_load


def laughs(levels: int, key: str = "bomb") -> str:
    """Nine of the level below at each level: 9**levels values from a few hundred bytes."""
    lines = [f'{key}:', '  l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_is_refused_before_it_expands() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(YamlTooLarge, match="expands past"):
            safe_load(laughs(9))  # 387 million values
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024  # measured, not expanded (before: 1.9 GB at seven levels)


def test_an_alias_inside_what_it_names_is_refused() -> None:
    with pytest.raises(YamlTooLarge, match="contains it"):
        safe_load("a: &a [1, *a]\n")


def test_ordinary_documents_load_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "defaults: &d {retries: 3, tags: [a, b]}\nfirst: *d\nsecond: {<<: *d, retries: 5}\n"
    assert safe_load(text) == {"defaults": {"retries": 3, "tags": ["a", "b"]}, "first": {"retries": 3, "tags": ["a", "b"]},
                               "second": {"retries": 5, "tags": ["a", "b"]}}
    assert safe_load(laughs(6)) is not None  # 9**6 = 531 441 values: within the bound
    assert MAX_EXPANDED_NODES == 1_000_000
    monkeypatch.setattr("kernel.yamldoc.MAX_EXPANDED_NODES", 1000)  # a small bound, so the file stays small
    big = "items:\n" + "".join(f"- {i}\n" for i in range(5000))  # no aliases, past the bound
    assert len(safe_load(big)["items"]) == 5000  # the bound grows with the text: no plain document reaches it
    with pytest.raises(YamlTooLarge):
        safe_load(laughs(4))  # 6 561 values from a few hundred bytes


def test_a_case_file_of_laughs_is_a_validation_error() -> None:
    text = laughs(8, key="anchors") + "agent_id: shell\ncases:\n  - {name: x, target: t, args: {a: *l7}, expect: allow}\n"
    with pytest.raises(ValidationError, match="expands past"):
        parse_cases(text, source="bomb.policytest.yaml")
    with pytest.raises(ValidationError, match=r"nesting depth|nested too deep"):
        parse_cases("cases:\n  - {name: x, target: t, args: " + "[" * 5000 + "]" * 5000 + ", expect: allow}\n")


def _tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            raw = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


POLICY = 'package regent.policy\ndefault decision := {"action": "allow"}\n'


@pytest.mark.parametrize(("name", "text", "match"), [
    ("data.yaml", laughs(8), "expands past"),
    ("data.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "cannot be parsed"),
], ids=["yaml-laughs", "json-nested-100000"])
def test_a_bundle_whose_data_would_blow_up_is_refused(name: str, text: str, match: str) -> None:
    # Before: 1.9 GB and a compiler timeout for seven levels of laughs; a RecursionError (a 500)
    # for the deep JSON. Both in the load gate and in the signature check, which runs first.
    with pytest.raises(ValidationError, match=match):
        parse_rego_tarball(_tarball({"policy.rego": POLICY, name: text}))
    with pytest.raises(ValidationError, match="cannot be parsed for hashing"):
        hashed_bytes(name, text.encode())
    assert json.loads(hashed_bytes("data.json", b'{"b": [1, 2]}')) == {"b": [1, 2]}
