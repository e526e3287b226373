"""Built-ins rego-cpp never returned from on an empty argument (guards.py): the rewrite itself,
and through the worker pool, that agent input with `""` neither times out nor costs a worker."""

from __future__ import annotations

import time

from kernel.policy.rego import RegoEngine, compile_rego_bundle
from kernel.policy.rego.guards import GUARDED, guard_builtins, guard_notes
from kernel.policy.rego.idioms import rewrite_idioms

from .conftest import bundle_of

SOURCE = 'package m\n\np := replace(input.s, input.old, "-")\nq := strings.replace_n(input.p, input.s)\n'


def test_guarded_calls_are_renamed_and_every_author_line_keeps_its_number() -> None:
    out = guard_builtins(SOURCE)
    assert out.splitlines()[:4] == [
        "package m", "", 'p := __regent_guard_replace(input.s, input.old, "-")',
        "q := __regent_guard_replace_n(input.p, input.s)"]
    assert "__regent_guard_replace(s, old, new) :=" in out and "__regent_guard_empty_key(p) if" in out
    assert "yaml" not in out  # only the helpers the module uses


def test_a_module_without_guarded_calls_is_left_byte_for_byte() -> None:
    source = 'package m\np := upper(input.s)  # replace( in a comment\nq := "replace(x)"'
    assert guard_builtins(source) == source


def test_a_rule_the_module_defines_with_a_builtin_name_is_not_guarded() -> None:
    source = "package m\nreplace(x, y, z) := 1\np := replace(1, 2, 3)\n"
    assert guard_builtins(source) == source


def test_the_rewrite_notes_name_each_guarded_call_where_the_author_wrote_it() -> None:
    notes = rewrite_idioms("package m\np if { endswith(input.a[_], replace(input.b, \"\", \"x\")) }\n").notes
    assert [(line, col) for line, col, n in notes if "guard" in n] == [(2, 29)]
    assert guard_notes(SOURCE)[1][:2] == (4, 6)
    assert set(GUARDED) >= {"replace", "strings.replace_n", "regex.split", "yaml.unmarshal"}


def test_an_empty_old_from_agent_input_neither_times_out_nor_costs_a_worker() -> None:
    policy = 'deny contains "x" if { replace(input.s, input.old, "-") == "-a-b-" }\n'
    with RegoEngine(size=1, timeout=2.0) as engine:
        bundle = compile_rego_bundle(bundle_of(policy, regent={"entrypoint": "shell/deny"}), engine=engine)
        started = time.monotonic()
        for _ in range(20):  # each took the whole 2 s evaluation timeout and a worker before guards.py
            [got] = engine.probe(bundle, {"s": "ab", "old": ""}, ["shell/deny"])
            assert got == {"value": ["x"]}
        assert time.monotonic() - started < 20  # 20 timeouts would take 40 s
        stats = engine.stats()
        assert stats["timeouts"] == 0 and stats["workers_replaced"] == 0, stats


def test_a_regex_result_that_splits_a_character_is_an_eval_error_and_costs_no_worker() -> None:
    # rego-cpp's regexes match bytes: `.` takes one byte of "é", and reading the result killed
    # the worker on every evaluation (UnicodeDecodeError, exit status 1).
    policy = 'deny contains "x" if { regex.find_n(".", input.s, -1) }\np := regex.find_n(".", input.s, -1)\n'
    with RegoEngine(size=1, timeout=2.0) as engine:
        bundle = compile_rego_bundle(bundle_of(policy, regent={"entrypoint": "shell/p"}), engine=engine)
        for _ in range(3):
            [got] = engine.probe(bundle, {"s": "é"}, ["shell/p"])
            assert "not valid UTF-8" in got["error"]
        assert engine.stats()["workers_replaced"] == 0
        decision = engine.evaluate_document(bundle, {"s": "é"})
        assert decision.rule_id == "eval-error"
        assert engine.stats()["workers_replaced"] == 0
