"""Mask rules: JSON pointers below `input`, removed or replaced on a copy (never in place)."""

from __future__ import annotations

import copy

import pytest

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
