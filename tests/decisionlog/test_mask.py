"""Mask rules: JSON pointers below `input`, removed or replaced on a copy (never in place)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.decisionlog import apply_masks, parse_mask_rules
from kernel.errors import ConfigError

ENTRY = {"decision_id": "d1", "input": {"args": {"password": "hunter2", "user": "ann", "keys": ["a", "b"]},
                                          "execution": {"input": {"ssn": "123"}}}}


def test_remove_rules_drop_the_fields_and_list_them_as_erased() -> None:
    rules = parse_mask_rules("/args/password, /input/execution/input/ssn")
    before = copy.deepcopy(ENTRY)
    out = apply_masks(ENTRY, rules)
    assert out["input"]["args"] == {"user": "ann", "keys": ["a", "b"]}
    assert out["input"]["execution"] == {"input": {}}
    assert out["erased"] == ["/input/args/password", "/input/execution/input/ssn"]
    assert before == ENTRY  # the kernel's own objects are never touched


def test_upsert_rules_replace_values_and_list_them_as_masked() -> None:
    rules = parse_mask_rules('[{"op": "upsert", "path": "/input/args/password", "value": "**REDACTED**"},'
                             ' {"op": "upsert", "path": "/args/keys/1", "value": "x"}]')
    out = apply_masks(ENTRY, rules)
    assert out["input"]["args"]["password"] == "**REDACTED**"
    assert out["input"]["args"]["keys"] == ["a", "x"]
    assert out["masked"] == ["/input/args/password", "/input/args/keys/1"]
    assert "erased" not in out


def test_a_path_that_is_absent_changes_nothing() -> None:
    out = apply_masks(ENTRY, parse_mask_rules("/args/nope/deeper,/usage/x"))
    assert out["input"] == ENTRY["input"] and "erased" not in out


def test_a_list_index_is_plain_digits_within_the_list() -> None:
    # "²" passes str.isdigit() but not int(): it raised at the first decision the rule met.
    out = apply_masks(ENTRY, parse_mask_rules("/args/keys/²,/args/keys/2,/args/keys/01x"))
    assert out["input"]["args"]["keys"] == ["a", "b"] and "erased" not in out
    assert apply_masks(ENTRY, parse_mask_rules("/args/keys/0"))["input"]["args"]["keys"] == ["b"]


def test_pointer_escapes_name_keys_with_slashes_and_tildes() -> None:
    entry = {"input": {"args": {"a/b": 1, "c~d": 2, "e": 3}}}
    out = apply_masks(entry, parse_mask_rules("/args/a~1b,/args/c~0d"))
    assert out["input"]["args"] == {"e": 3}
    assert out["erased"] == ["/input/args/a~1b", "/input/args/c~0d"]


@pytest.mark.parametrize("text", ["args/password", "/", "/input", '[{"op": "drop", "path": "/a"}]',
                                  '[{"op": "upsert", "path": "/a"}]', "[not json"],
                         ids=["no-slash", "root", "input-itself", "bad-op", "upsert-without-value", "bad-json"])
def test_bad_mask_rules_are_refused_at_start(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_mask_rules(text)


# -- upsert as OPA documents it; replace; wildcards (docs/policy-rollout.md, "Masking") -----------
def _one(rule: str) -> Any:
    return parse_mask_rules(f"[{rule}]")


def test_upsert_adds_an_absent_field_as_opa_does() -> None:
    """OPA: "If the field exists it is overwritten, if it does not exist it will be added" (and
    its mkdirp makes the missing objects on the way down)."""
    out = apply_masks(ENTRY, _one('{"op": "upsert", "path": "/input/args/card/number", "value": "****"}'))
    assert out["input"]["args"]["card"] == {"number": "****"}
    assert out["masked"] == ["/input/args/card/number"]
    assert "card" not in ENTRY["input"]["args"]  # type: ignore[operator]


def test_upsert_below_a_value_that_is_not_an_object_changes_nothing() -> None:
    out = apply_masks(ENTRY, _one('{"op": "upsert", "path": "/args/user/first", "value": "x"}'))
    assert out["input"] == ENTRY["input"] and "masked" not in out


def test_replace_sets_a_field_only_where_it_exists() -> None:
    rules = _one('{"op": "replace", "path": "/args/password", "value": "****"}, '
                 '{"op": "replace", "path": "/args/card", "value": "****"}')
    out = apply_masks(ENTRY, rules)
    assert out["input"]["args"] == {"password": "****", "user": "ann", "keys": ["a", "b"]}
    assert out["masked"] == ["/input/args/password"]


def test_a_field_is_removed_wherever_the_step_carries_it() -> None:
    """The regression: `/args/iban` removed, the same IBAN still shipped inside the execution's
    input. `/**/iban` finds it at any depth, in lists too."""
    entry = {"input": {"args": {"iban": "DE89370400440532013000", "amount": 5},
                       "execution": {"input": {"payment": {"iban": "DE89370400440532013000"},
                                               "history": [{"iban": "FR14"}, {"note": "x"}]}}}}
    before = copy.deepcopy(entry)
    out = apply_masks(entry, parse_mask_rules("/**/iban"))
    assert "DE89" not in json.dumps(out) and "FR14" not in json.dumps(out)
    assert out["input"]["execution"]["input"]["history"] == [{}, {"note": "x"}]
    assert out["erased"] == ["/input/args/iban", "/input/execution/input/payment/iban",
                             "/input/execution/input/history/0/iban"]
    assert entry == before


def test_a_wildcard_upsert_masks_what_it_finds_and_adds_nothing() -> None:
    entry = {"input": {"args": {"iban": "DE89"}, "execution": {"input": {"other": 1}}}}
    out = apply_masks(entry, _one('{"op": "upsert", "path": "/**/iban", "value": "****"}'))
    assert out["input"] == {"args": {"iban": "****"}, "execution": {"input": {"other": 1}}}
    assert out["masked"] == ["/input/args/iban"]


def test_one_star_is_any_one_key() -> None:
    entry = {"input": {"args": {"card": {"number": "4111"}}, "execution": {"input": {"card": {"number": "4111"}}}}}
    out = apply_masks(entry, parse_mask_rules("/*/card/number"))
    assert out["input"]["args"] == {"card": {}} and out["input"]["execution"]["input"]["card"] == {"number": "4111"}
    assert apply_masks(entry, parse_mask_rules("/args/*"))["input"]["args"] == {}


@pytest.mark.parametrize("text", ["/**", "/*", "/args/**", '[{"op": "replace", "path": "/a"}]'],
                         ids=["any-depth-alone", "any-one-alone", "trailing-any-depth", "replace-without-value"])
def test_wildcard_rules_that_name_no_field_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_mask_rules(text)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["iban", "a", "b", "c"]), inner,
                                                                max_size=4),
    max_leaves=25,
)


def _drop_everywhere(node: Any, key: str) -> Any:
    """The oracle: a plain deep walk that leaves out every member named `key`."""
    if isinstance(node, dict):
        return {k: _drop_everywhere(v, key) for k, v in node.items() if k != key}
    if isinstance(node, list):
        return [_drop_everywhere(v, key) for v in node]
    return node


@given(_json_values)
@settings(max_examples=300, deadline=None)
def test_any_depth_removal_agrees_with_a_plain_deep_walk(doc: Any) -> None:
    entry = {"input": {"args": doc, "execution": {"input": doc}}}
    before = copy.deepcopy(entry)
    out = apply_masks(entry, parse_mask_rules("/**/iban"))
    assert out["input"] == _drop_everywhere(before["input"], "iban")
    assert entry == before
    assert ("erased" in out) == _has_key(before, "iban")


def _has_key(node: Any, key: str) -> bool:
    if isinstance(node, dict):
        return key in node or any(_has_key(v, key) for v in node.values())
    return isinstance(node, list) and any(_has_key(v, key) for v in node)
