"""The load gate: compile errors with file:line:col, builtins, roots, entrypoint, crashes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from kernel.errors import ValidationError
from kernel.policy.rego import RegoEngine, compile_rego_bundle, parse_rego_bundle

from .conftest import HEADER, bundle_of

GOOD = 'decision := {"decision": "allow", "rule_id": "a"} if input.target == "ls"\n'


def problems_of(exc: pytest.ExceptionInfo[ValidationError]) -> list[str]:
    message = exc.value.message
    assert message.startswith("invalid policy bundle: ")
    return message.removeprefix("invalid policy bundle: ").splitlines()


def test_valid_bundle_passes_the_gate(engine: RegoEngine) -> None:
    b = bundle_of(GOOD)
    assert compile_rego_bundle(b, engine=engine) is b


def test_gate_accepts_a_mapping_without_an_engine() -> None:
    b = compile_rego_bundle(
        {"modules": {"shell/policy.rego": HEADER + GOOD}, "manifest": {"roots": ["shell"]}}
    )
    assert b.entrypoint == "shell/decision"


def test_parse_error_reported_as_file_line_col(engine: RegoEngine) -> None:
    b = bundle_of(HEADER + "decision := {\n")
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    problems = problems_of(info)
    assert "shell/policy.rego:4:13: this is unclosed" in problems
    assert not any("rego-errorseq" in p or "(error" in p for p in problems)


def test_errors_in_two_files_are_all_listed(engine: RegoEngine) -> None:
    b = bundle_of(GOOD, extra_modules={"shell/lib.rego": "package shell\nimport rego.v1\nx := [\n"})
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert any(p.startswith("shell/lib.rego:3:6: ") for p in problems_of(info))


def test_compile_error_in_directory_bundle_names_the_file_on_disk(
    tmp_path: Path, engine: RegoEngine
) -> None:
    root = tmp_path / "shell"
    root.mkdir()
    (root / ".manifest").write_text(json.dumps({"roots": ["shell"]}))
    (root / "policy.rego").write_text(
        "package shell\nimport rego.v1\nimport data.a as x\nimport data.b as x\n" + GOOD
    )
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(root, engine=engine)
    assert f"{root}/policy.rego:4:1: import must not shadow import data.a" in problems_of(info)


def test_tarball_passes_the_gate(tmp_path: Path, engine: RegoEngine) -> None:
    root = tmp_path / "shell"
    root.mkdir()
    (root / ".manifest").write_text(json.dumps({"revision": "r1", "roots": ["shell"]}))
    (root / "policy.rego").write_text(HEADER + GOOD)
    archive = tmp_path / "shell.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname=".")
    assert compile_rego_bundle(archive, engine=engine).revision == "r1"


@pytest.mark.parametrize(
    ("call", "name"),
    [
        ('http.send({"method": "get", "url": "http://x"})', "http.send"),
        ('net.cidr_contains("10.0.0.0/8", "10.1.1.1")', "net.cidr_contains"),
        ('strings.render_template("{{.x}}", {})', "strings.render_template"),
        ("json.match_schema({}, {})", "json.match_schema"),
    ],
    ids=["http.send", "net.*", "render_template", "match_schema"],
)
def test_unsupported_builtin_is_rejected(call: str, name: str, engine: RegoEngine) -> None:
    b = bundle_of(GOOD + f"other if {{\n    x := {call}\n    x\n}}\n")
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert f"shell/policy.rego:6:10: builtin {name} is not supported by rego-cpp" in problems_of(
        info
    )


def test_unknown_function_is_rejected(engine: RegoEngine) -> None:
    b = bundle_of(GOOD + "other if foo.bar(1)\nalso if nope(2)\n")
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    problems = problems_of(info)
    assert "shell/policy.rego:5:10: unknown function foo.bar" in problems
    assert "shell/policy.rego:6:9: unknown function nope" in problems


def test_user_functions_imports_and_builtins_are_accepted(engine: RegoEngine) -> None:
    lib = 'package shell.lib\nimport rego.v1\nis_ls(cmd) if startswith(cmd, "ls")\n'
    policy = (
        "import data.shell.lib\n"
        "import data.shell.lib.is_ls as ls_like\n"
        "double(x) := x * 2\n"
        'decision := {"decision": "allow", "rule_id": "a"} if {\n'
        "    lib.is_ls(input.args.command)\n"
        "    ls_like(input.args.command)\n"
        "    data.shell.lib.is_ls(input.args.command)\n"
        "    double(2) == 4\n"
        '    count(split("a b", " ")) == 2\n'
        '    print("checked", input.target)\n'
        "}\n"
    )
    compile_rego_bundle(bundle_of(policy, extra_modules={"shell/lib.rego": lib}), engine=engine)


def test_module_outside_roots_is_rejected(engine: RegoEngine) -> None:
    b = bundle_of(GOOD, extra_modules={"other/x.rego": "package other\nimport rego.v1\nx := 1\n"})
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert "other/x.rego:1:1: package other is outside the manifest roots ['shell']" in problems_of(
        info
    )


def test_data_outside_roots_is_rejected(engine: RegoEngine) -> None:
    b = bundle_of(GOOD, data={"shell": {"ok": 1}, "secrets": {"k": 1}})
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert "data: secrets is outside the manifest roots ['shell']" in problems_of(info)


@pytest.mark.parametrize(
    "roots",
    [["shell", "shell/sub"], ["shell", "shell"], ["", "shell"]],
    ids=["nested", "duplicate", "empty"],
)
def test_overlapping_roots_are_rejected(roots: list[str], engine: RegoEngine) -> None:
    b = bundle_of(GOOD, roots=roots, regent={"entrypoint": "shell/decision"})
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert any("overlap" in p for p in problems_of(info))


def test_missing_entrypoint_rule_is_rejected(engine: RegoEngine) -> None:
    b = bundle_of('allow if input.target == "ls"\n')
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    assert problems_of(info) == [
        ".manifest: entrypoint shell/decision is not defined: no module declares rule decision in package shell"
    ]


def test_explicit_entrypoint_in_subpackage_is_found(engine: RegoEngine) -> None:
    b = bundle_of(
        'package shell.policy\nimport rego.v1\nmain contains {"decision": "allow", "rule_id": "a"} if true\n',
        regent={"entrypoint": "shell/policy/main"},
    )
    compile_rego_bundle(b, engine=engine)


def test_judge_decision_loads(engine: RegoEngine) -> None:
    b = bundle_of('decision := {"decision": "judge", "rule_id": "j", "judge": {"fallback": "deny"}}\n')
    compile_rego_bundle(b, engine=engine)


def test_bundle_that_crashes_the_compiler_is_rejected_readably(engine: RegoEngine) -> None:
    # regopy-notes hazard 1: rego-cpp aborts building a rule that uses `with input as {...}`.
    b = bundle_of(
        'd if startswith(input.c, "ls")\n'
        'decision := {"decision": "allow", "rule_id": "a"} if {\n'
        '    d with input as {"c": "ls -la"}\n'
        "}\n"
    )
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    problems = problems_of(info)
    assert "the Rego compiler crashed (killed by SIGABRT) on this bundle" in problems
    assert any(p.startswith("shell/policy.rego:6:7: `with input as …`") for p in problems)
    assert engine.wait_ready()


def test_bundle_rego_cpp_cannot_run_is_rejected(engine: RegoEngine) -> None:
    keys = ", ".join(f'"k{i}": {i}' for i in range(7))
    b = bundle_of(GOOD + f"table := {{{keys}}}\n")
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    (problem,) = problems_of(info)
    assert problem.startswith("rego-cpp cannot run this bundle (wellformed_error: bundle verify")
    assert "move such constants into data.json" in problem


def test_numeric_table_in_data_passes(engine: RegoEngine) -> None:
    b = bundle_of(
        GOOD + "table := data.shell.table\n",
        data={"shell": {"table": {f"k{i}": i for i in range(50)}}},
    )
    compile_rego_bundle(b, engine=engine)


def test_problem_lines_cover_several_kinds_at_once(engine: RegoEngine) -> None:
    b = parse_rego_bundle(
        {
            "modules": {
                "a.rego": "package shell\nimport rego.v1\nx if http.send({})\n",
                "b.rego": "package elsewhere\nimport rego.v1\ny := (\n",
            },
            "manifest": {"roots": ["shell"]},
        }
    )
    with pytest.raises(ValidationError) as info:
        compile_rego_bundle(b, engine=engine)
    problems = problems_of(info)
    assert "b.rego:1:1: package elsewhere is outside the manifest roots ['shell']" in problems
    assert "b.rego:3:6: this is unclosed" in problems
    assert "a.rego:3:6: builtin http.send is not supported by rego-cpp" in problems
    assert any(
        p.startswith(".manifest: entrypoint shell/decision is not defined") for p in problems
    )
