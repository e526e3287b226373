"""YAML from outside with its aliases' expansion bounded (kernel/yamldoc.py): a billion laughs in
a case file, a bundle's data.yaml or its signature check is a clear refusal, cheaply; ordinary
documents, aliases included, load as before."""

from __future__ import annotations

import io
import json
import math
import tarfile
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(("text", "value"), [
    ("1e6", 1e6), ("1E3", 1000.0), ("-2.5e-3", -0.0025), (".5", 0.5), ("1.", 1.0), ("1.0e+6", 1e6),
    ("0x1F", 31), ("12345678901234567890", 12345678901234567890), ("-0", 0), (".inf", float("inf")),
    ("'1e6'", "1e6"), ("\"017\"", "017"), ("1e-400", 0.0),
])
def test_numbers_are_read_as_yaml_1_2_reads_them(text: str, value: object) -> None:
    assert safe_load(f"a: {text}") == {"a": value}


@pytest.mark.parametrize("text", ["017", "08", "0o17", "0b101", "1_000", "1_000.5", "12:30", "-0x_1"])
def test_a_scalar_yaml_1_1_and_1_2_read_differently_is_refused_with_its_line(text: str) -> None:
    with pytest.raises(Exception, match=r"read as different values by YAML 1\.1 and YAML 1\.2") as info:
        safe_load(f"x: 1\na: {text}\n")
    assert info.value.problem_mark.line + 1 == 2  # type: ignore[attr-defined]


def test_a_number_beyond_float64_is_refused() -> None:
    with pytest.raises(Exception, match="1e400 is beyond float64's range"):
        safe_load("a: 1e400")


def test_case_files_read_exponents_as_numbers_and_name_the_line_of_an_ambiguous_one() -> None:
    [case] = parse_cases("cases:\n  - {name: big, target: pay, args: {amount: 1e6}, expect: allow}\n")
    assert case.args == {"amount": 1e6}
    with pytest.raises(ValidationError, match=r"^cases.yaml:3: 017 is read as different values"):
        parse_cases("cases:\n  - name: octal\n    args: {amount: 017}\n    target: pay\n", source="cases.yaml")


def test_data_yaml_reads_exponents_as_numbers() -> None:
    tar = _tarball({"data.yaml": "limits:\n  max: 1e6\n", "p.rego": "package limits\nimport rego.v1\nx := 1\n"})
    assert parse_rego_tarball(tar).data == {"limits": {"max": 1e6}}


def test_yaml_bundles_compare_an_exponent_bound_as_a_number() -> None:
    from kernel.domain.decision import PolicyInput
    from kernel.policy.yaml import compile_yaml_bundle

    bundle = compile_yaml_bundle("rules:\n  - id: big\n    when:\n      target: pay\n      arguments:\n"
                                 "        amount: {type: number, gt: 1e6}\n    then: {decision: allow}\n", revision="r")
    pay = [PolicyInput(agent_id="a", kind="tool_call", target="pay", args={"amount": a}) for a in (2e6, 5)]
    assert [bundle.evaluate(p).rule_id for p in pay] == ["big", "default"]


def test_a_manifest_refuses_an_ambiguous_number_with_file_and_line(tmp_path: pytest.TempPathFactory) -> None:
    from kernel.errors import ConfigError
    from kernel.manifest import load_manifest

    path = tmp_path / "regent.yaml"  # type: ignore[operator]
    path.write_text("agents:\n  - id: a\n    webhook_url: http://127.0.0.1:1/w\n    secret: s\n"
                    "    lease_timeout_seconds: 0600\n")
    with pytest.raises(ConfigError, match=r"regent.yaml:5"):
        load_manifest(path, {})


# YAML 1.2's core schema reads every JSON number as JSON does (its JSON schema is a subset): an
# independent answer for the number reading the case files, bundles, data.yaml and manifests share.
_INT = st.integers(min_value=-(10**30), max_value=10**30).map(str)
_DECIMAL = st.builds(lambda i, f: f"{i}.{f}", st.integers(-(10**9), 10**9).map(str),
                     st.text("0123456789", min_size=1, max_size=17))
_EXPONENT = st.builds(lambda m, e, mark, sign: f"{m}{mark}{sign}{e}", st.one_of(_INT, _DECIMAL),
                      st.integers(0, 300), st.sampled_from("eE"), st.sampled_from(["", "+", "-"]))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.one_of(_INT, _DECIMAL, _EXPONENT))
def test_a_json_number_reads_as_json_reads_it(text: str) -> None:
    want = json.loads(text)
    if isinstance(want, float) and not math.isfinite(want):
        with pytest.raises(ValidationError):  # beyond float64: refused (docs/testing-policies.md)
            safe_load(f"v: {text}\n")
        return
    got = safe_load(f"v: {text}\n")["v"]
    assert type(got) is type(want) and got == want, (text, got, want)
