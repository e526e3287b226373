"""Line coverage from Rego unit tests (`test_*` rules in a `*_test.rego` file), read from probes.

A unit test evaluates the bundle's rules under its own `with` clauses (`some d in
data.payments.decision with input.target as "shell"`), which the bundle's probe collector does not
see. So the test file gets an instrumented twin of its own: the bundle's modules and the test file,
probed as `instrument.py` does, plus for each test expression that names a bundle rule one query
rule, in the test's package (so its names resolve as the test's do):

    __regent_cov_<t>_<k> contains h if {
        e1; …; e(k-1)                                      # the test's earlier expressions
        hs := data.<collector>.hits_<j> with …             # expression k's own `with` clauses
        some h in hs
    }

where `hits_<j>` collects only the probes of the rules expression k can reach (so the query runs
what the test would, and no unrelated builtin). Lines are then marked from each expression's hits
and roots (the rules it names; a rule it replaces with `with` is not evaluated), and the test
file's own lines from its probes, as `opa test --coverage` reports test files too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from .instrument import Instrumented, LineCoverage, instrument, references
from .scan import _TOKEN

__all__ = ["TestProbes", "instrument_tests", "split_with"]


@dataclass(frozen=True, slots=True)
class _Query:
    rule: str  # the query rule's name, in the test's package
    roots: tuple[tuple[str, str], ...]
    mocked: frozenset[tuple[str, str]]


@dataclass
class TestProbes:
    """The twin to load for one test file and how to read what its queries answer."""

    modules: dict[str, str]
    test_path: str
    package: str  # the test file's package
    probes: Instrumented
    queries: dict[str, list[_Query]] = field(default_factory=dict)  # test rule → its query rules
    test_hits: str = ""  # the query for the test file's own probes

    def query_for(self, test: str) -> str:
        """One Rego query answering every expression of ``test`` (rule name): an object of sets."""
        items = ", ".join(f'"{q.rule}": data.{self.package}.{q.rule}' for q in self.queries.get(test, []))
        return f"x := {{{items}}}"

    def coverage(self, answers: dict[str, Any], test_hits: list[str] | None, ran: list[str]) -> LineCoverage:
        """Lines covered by the tests in ``ran`` given each query rule's answer (a list of probe
        names) and the test file's own probe hits."""
        cov = self.probes.line_coverage(set(), roots=())  # every line, none covered yet
        bundle_paths = frozenset(p for p in self.probes.module_rules if p != self.test_path)
        seen: set[tuple[frozenset[str], tuple[tuple[str, str], ...], frozenset[tuple[str, str]]]] = set()
        for test in ran:
            for q in self.queries.get(test, []):
                hits = answers.get(q.rule)
                if not isinstance(hits, list):
                    continue
                key = (frozenset(map(str, hits)), q.roots, q.mocked)
                if key in seen:
                    continue
                seen.add(key)
                cov.merge(self.probes.line_coverage(set(key[0]), q.roots, q.mocked, bundle_paths))
        if test_hits is not None:
            roots = [(self.package, t) for t in ran]
            cov.merge(self.probes.line_coverage(set(test_hits), roots, paths=frozenset({self.test_path})))
        return cov


def split_with(text: str) -> tuple[str, str, list[str]]:
    """An expression's text without its top-level `with` clauses, those clauses verbatim (from the
    first `with`), and each clause's target (`input.x`, `data.pkg.rule`, `f`)."""
    depth = 0
    cut = -1
    targets: list[str] = []
    target_start = -1
    for m in _TOKEN.finditer(text):
        kind, tok = m.lastgroup, m.group()
        if kind == "op" and tok in "([{":
            depth += 1
        elif kind == "op" and tok in ")]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and kind == "ident" and tok == "with":
            if cut < 0:
                cut = m.start()
            target_start = m.end()
        elif depth == 0 and kind == "ident" and tok == "as" and target_start >= 0:
            targets.append(text[target_start : m.start()].strip())
            target_start = -1
    if cut < 0:
        return text, "", []
    return text[:cut].rstrip(), text[cut:], targets


def instrument_tests(modules: dict[str, str], entrypoint: str, test_path: str, test_source: str,
                     tests: list[str]) -> TestProbes:
    """The coverage twin of ``modules`` (the bundle) with the test file, for the test rules
    ``tests`` (rule names)."""
    inst = instrument({**modules, test_path: test_source}, entrypoint)
    test_rules = inst.module_rules[test_path]
    package = test_rules.package
    tag = hashlib.sha256(test_path.encode()).hexdigest()[:10]
    collector = f"regent_testcov_{tag}"
    out = TestProbes(dict(inst.modules), test_path, package, inst)
    if test_path in inst.skipped or not package:
        return out
    aliases = inst.aliases[test_path]
    by_name = inst.by_name
    probes_of: dict[tuple[str, str], list[str]] = {}
    for name, (path, index, _k) in inst.probes.items():
        mr = inst.module_rules[path]
        probes_of.setdefault((mr.package, mr.rules[index].name), []).append(name)
    calls = _call_graph(inst)
    collectors: dict[frozenset[str], str] = {}
    collector_lines = [f"package {collector}", "import rego.v1", ""]
    rule_lines: list[str] = []
    wanted = set(tests)
    for d in test_rules.rules:
        if d.name not in wanted or d.kind not in ("complete", "multi"):
            continue
        for k, expr in enumerate(d.body, start=1):
            _, clauses, targets = split_with(expr.text)
            mocked = frozenset(r for t in targets for r in references(t, package, by_name, aliases)
                               if _names_whole_rule(t, r, package, aliases))
            roots = tuple(r for r in dict.fromkeys(references(expr.text, package, by_name, aliases)) if r not in mocked)
            if not roots:
                continue
            reach = _closure(roots, calls, mocked)
            names = frozenset(n for rule in reach for n in probes_of.get(rule, ()))
            if not names:
                continue
            hits_rule = collectors.get(names)
            if hits_rule is None:
                hits_rule = collectors[names] = f"hits_{len(collectors)}"
                for n in sorted(names):
                    collector_lines.append(f'{hits_rule} contains "{n}" if data.{inst.probe_package[n]}.{n}')
                collector_lines.append("")
            rule = f"__regent_cov_{d.index}_{k}"
            prefix = [e.text for e in d.body[: k - 1]]
            body = "\n\t".join([*prefix, f"regent_cov_hs := data.{collector}.{hits_rule} {clauses}".rstrip(),
                                "some regent_cov_h in regent_cov_hs"])
            rule_lines += [f"{rule} contains regent_cov_h if {{", f"\t{body}", "}", ""]
            out.queries.setdefault(d.name, []).append(_Query(rule, roots, mocked))
    # Only the tests that ran and the test file's rules they name: another test's probes would
    # run what that test runs (a todo, or one left out by --run).
    ran = _closure(tuple((package, t) for t in wanted), calls, frozenset())
    own = sorted(n for n, (path, i, _k) in inst.probes.items()
                 if path == test_path and (package, test_rules.rules[i].name) in ran)
    collector_lines += [f'test_hits contains "{n}" if data.{package}.{n}' for n in own]
    if not own:
        collector_lines.append("test_hits := set()")
    out.test_hits = f"x := data.{collector}.test_hits"
    header = [f"package {package}", *test_rules.imports, ""]
    out.modules[f"{collector}.rego"] = "\n".join(collector_lines) + "\n"
    out.modules[f"{collector}.queries.rego"] = "\n".join(header + rule_lines) + "\n"
    return out


def _names_whole_rule(target: str, rule: tuple[str, str], package: str, aliases: dict[str, str]) -> bool:
    """Whether a `with` target replaces the rule itself (`data.pkg.rule`, `rule`, `alias.rule`), not
    a path inside its value."""
    head = target.split(".", 1)[0]
    if head in aliases:
        target = aliases[head] + target[len(head) :]
    full = f"data.{rule[0]}.{rule[1]}"
    return target in (full, rule[1] if rule[0] == package else full)


def _call_graph(inst: Instrumented) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """Rule → the rules its bodies name (a static over-approximation of what it evaluates)."""
    graph: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path, mr in inst.module_rules.items():
        aliases = inst.aliases[path]
        for d in mr.rules:
            edges = graph.setdefault((mr.package, d.name), set())
            for e in d.body:
                edges.update(references(e.text, mr.package, inst.by_name, aliases))
    return graph


def _closure(roots: tuple[tuple[str, str], ...], graph: dict[tuple[str, str], set[tuple[str, str]]],
             mocked: frozenset[tuple[str, str]]) -> set[tuple[str, str]]:
    seen: set[tuple[str, str]] = set()
    stack = [r for r in roots if r not in mocked]
    while stack:
        rule = stack.pop()
        if rule in seen:
            continue
        seen.add(rule)
        stack.extend(r for r in graph.get(rule, ()) if r not in seen and r not in mocked)
    return seen
