"""The lexical scan of Rego modules and the s-expression error parser (pure)."""

from __future__ import annotations

from kernel.policy.rego.diagnostics import CompileError, compile_errors, line_col
from kernel.policy.rego.scan import scan_module

MODULE = """package shell.tools
import rego.v1
import data.lib.strings as s
import data.lib.cidr
import input.args

# a comment with f(x) in it
default decision := {"decision": "deny", "rule_id": "d"}

is_ls(cmd) if startswith(cmd, "ls")

decision := {"decision": "allow", "rule_id": "a"} if {
    is_ls(args.command)
    s.trim_all(input.x) == "y(z)"
    x := `raw f(y)`
    count([v | some v in numbers.range(1, 3)]) == 3
    not net.cidr_contains("10.0.0.0/8", input.ip)
    data.lib.check(input)
}

deny contains msg if {
    msg := sprintf("%v", [input])
}
"""


def test_scan_finds_package_imports_and_heads() -> None:
    scan = scan_module(MODULE)
    assert scan.package == "shell.tools"
    assert scan.package_line == 1
    assert scan.imports == {"s": "data.lib.strings", "cidr": "data.lib.cidr", "args": "input.args"}
    assert {"decision", "is_ls", "deny"} <= scan.heads
    assert "startswith" not in scan.heads


def test_scan_finds_calls_outside_strings_and_comments() -> None:
    calls = [(c.name, c.line, c.col) for c in scan_module(MODULE).calls]
    assert calls == [
        ("startswith", 10, 15),
        ("is_ls", 13, 5),
        ("s.trim_all", 14, 5),
        ("count", 16, 5),
        ("numbers.range", 16, 26),
        ("net.cidr_contains", 17, 9),
        ("data.lib.check", 18, 5),
        ("sprintf", 22, 12),
    ]


def test_scan_columns_are_byte_columns() -> None:
    (call,) = scan_module('package p\nx := "é" if upper("a")\n').calls
    assert (call.line, call.col) == (2, 14)


def test_scan_finds_whole_input_with() -> None:
    scan = scan_module('package p\nt if { d with input as {"c": 1} }\nu if { d with input.c as 1 }\n')
    assert scan.whole_input_with == ((2, 10),)


def test_scan_ref_heads() -> None:
    scan = scan_module('package p\nimport rego.v1\nrules.allow.ls := true\nd["x"] := 1\n')
    assert {"rules", "rules.allow.ls", "d", "d.x"} <= scan.heads


def _atom(text: str) -> str:
    return f"{len(text.encode())}:{text}"


Y_SOURCE = "package p\né := 1\nimport x\n"
SEXPR = (
    f"(rego-errorseq\n  (error {_atom('p/x.rego')}|30|2\n    (errormsg {_atom('this is unclosed')})\n"
    f"    (errorast |30|2))\n  (error\n    (errormsg {_atom('import must not shadow é')})\n"
    f"    (errorast\n      (rego-import {_atom('p/y.rego')}|{Y_SOURCE.encode().index(b'import')}|8\n"
    "        (rego-var |25|1:x)))\n    (rego-errorcode)))\n"
)


def test_sexpr_errors_become_file_line_col() -> None:
    sources = {"p/x.rego": "package p\nimport rego.v1\nd := {\n", "p/y.rego": Y_SOURCE}
    errors = compile_errors(SEXPR, "", sources)
    assert [str(e) for e in errors] == [
        "p/x.rego:3:6: this is unclosed",
        "p/y.rego:3:1: import must not shadow é",
    ]


def test_readable_report_is_the_fallback() -> None:
    report = "Errors:\nthis is unclosed\n-- p/x.rego:3:6\n     ~\nd := {\n\n----------------\nbad thing\n-- \n\nPass parse failed with 2 errors!\n"
    assert compile_errors("not an s-expression (", report, {}) == [
        CompileError("this is unclosed", "p/x.rego", 3, 6),
        CompileError("bad thing"),
    ]


def test_unparseable_error_is_kept_short_and_whole() -> None:
    (err,) = compile_errors("something   odd\nhappened", "", {})
    assert str(err) == "something odd happened"


def test_line_col_counts_bytes() -> None:
    assert line_col("a\néb\n", 5) == (2, 4)
