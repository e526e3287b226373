"""The conformance set's expectations checked against regorus, an independent Rego engine
(tests/policy/rego/oracle.py): the team wrote `want_result`s from OPA's documentation; this
asks another engine that targets OPA v1.

A case OPA and rego-cpp agree on: regorus must answer `want_result` (or also refuse / fail, for
`want_error_code`). A `known_difference` case: regorus must give OPA's answer, `opa_want_result`
or an error for `opa_want_error`. `regorus_skip: <reason>` marks the few cases where regorus
itself is known to differ from OPA or lacks the built-in; the list stays short and each has a
reason.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from .oracle import norm, regorus_eval
from .test_conformance import CASES

CHECKED = [(f, n, c) for f, n, c in CASES if "regorus_skip" not in c]
SKIPPED = [(f, n, c) for f, n, c in CASES if "regorus_skip" in c]


def _ask(case: dict[str, Any]) -> tuple[str, Any]:
    return regorus_eval(case["modules"], case.get("data"), case.get("input", {}), case["query"])


@pytest.mark.parametrize(("family", "note", "case"), CHECKED, ids=[f"{f}:{n}" for f, n, _ in CHECKED])
def test_regorus_agrees_with_the_conformance_expectation(family: str, note: str, case: dict[str, Any]) -> None:
    kind, got = _ask(case)
    if "known_difference" in case:
        if case.get("opa_want_error"):
            assert kind == "error", f"OPA fails here ({case['opa_result']}); regorus answered {got}"
            return
        want, sort = case["opa_want_result"], bool(case.get("sort_bindings"))
    elif "want_error_code" in case:
        assert kind == "error", f"Regent answers {case['want_error_code']}; regorus answered {got}"
        return
    else:
        want, sort = case["want_result"], bool(case.get("sort_bindings"))
    assert kind == "result", got.splitlines()[-1] if isinstance(got, str) else got
    assert norm(got, sort) == norm(want, sort)


def test_every_known_difference_says_what_opa_answers_in_the_case_shape() -> None:
    for _, note, case in CASES:
        if "known_difference" in case and "regorus_skip" not in case:
            assert "opa_want_result" in case or case.get("opa_want_error") is True, note


def test_the_regorus_skips_are_few_and_each_has_a_reason() -> None:
    assert len(SKIPPED) <= 20, [n for _, n, _ in SKIPPED]
    assert all(len(c["regorus_skip"]) > 30 for _, _, c in SKIPPED)


def test_crypto_cases_match_hashlib() -> None:
    # regorus' wheel has no crypto.*: the digests in builtins_crypto.yaml are checked here instead.
    want = {n: c["want_result"][0]["x"] for f, n, c in CASES if f == "builtins_crypto"}
    assert want["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert want["md5-sha1"] == [hashlib.md5(b"a").hexdigest(), hashlib.sha1(b"a").hexdigest()]
    assert want["hmac-sha256"] == hmac.new(b"key", b"msg", hashlib.sha256).hexdigest()
