"""Probes for traces, line coverage and runtime-error locations (pure: no regopy here).

rego-cpp has no tracer, and `print()` cannot stand in for one (it hoists constant prints out of
order). So a bundle gets an *instrumented* twin: beside each module, a module in the same package
(with the same imports) holding one probe rule per body prefix of each rule definition:

    __regent_<m>_<d>_<k> if { e1; …; e(k-1) }       # expression k was evaluated
    __regent_<m>_<d>_done if { e1; …; en }           # the definition's body held

`else` branches add `not <earlier branch>_done` in front. A collector rule gathers the probe names
that hold, so one query per input gives everything the trace and coverage need; each probe and each
rule is also an entrypoint, so an evaluation that errors can be pinned to the expression (or the
head) at fault. The probes run in the Rego workers, on the instrumented twin, only when asked for
(`--explain`, `--coverage`, an evaluation error): the plain bundle is never touched.

Function bodies are not probed (their arguments are unbound outside a call): their lines count
neither as covered nor as not covered, and the trace says so.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .rules import ModuleRules, RuleDef, read_rules

__all__ = ["Instrumented", "LineCoverage", "import_aliases", "instrument", "references"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_PROBED_KINDS = ("complete", "multi")


@dataclass(frozen=True, slots=True)
class _Module:
    path: str
    rules: ModuleRules


@dataclass
class Instrumented:
    """The instrumented twin of a bundle and how to read its probes."""

    modules: dict[str, str]  # the twin's modules (the originals plus one probe module each)
    entrypoints: tuple[str, ...]  # the collector first, then every probe, then every rule
    collector: str
    combined: str  # {"value": [entrypoint value] or [], "hits": [...]} in one query
    probes: dict[str, tuple[str, int, int]]  # probe rule name → (module path, def index, k, 0 = done, -1 = value)
    rule_entrypoints: dict[str, tuple[str, str]]  # entrypoint → (module path, rule name)
    module_rules: dict[str, ModuleRules]
    entrypoint_rule: tuple[str, str]  # (package, rule name) of the bundle's entrypoint
    skipped: dict[str, str] = field(default_factory=dict)  # module path → why it was not probed
    probe_package: dict[str, str] = field(default_factory=dict)  # probe name → package

    def probe_entrypoint(self, name: str) -> str:
        return f"{self.probe_package[name].replace('.', '/')}/{name}"

    # -- reading hits ------------------------------------------------------------------------
    @cached_property
    def by_name(self) -> dict[tuple[str, str], list[tuple[str, RuleDef]]]:
        """(package, rule name) → its definitions, with their module paths."""
        by_name: dict[tuple[str, str], list[tuple[str, RuleDef]]] = {}
        for path, mr in self.module_rules.items():
            for d in mr.rules:
                by_name.setdefault((mr.package, d.name), []).append((path, d))
        return by_name

    @cached_property
    def aliases(self) -> dict[str, dict[str, str]]:
        """Module path → its imports (alias → `data.…` ref)."""
        return {path: import_aliases(mr.imports) for path, mr in self.module_rules.items()}

    def reached(self, hits: set[str], roots: Iterable[tuple[str, str]] | None = None,
                mocked: frozenset[tuple[str, str]] = frozenset()) -> set[tuple[str, int]]:
        """(module path, def index) of the definitions that were evaluated at all: those of the
        ``roots`` (the entrypoint rule by default) and, to a fixpoint, of every rule named by an
        evaluated expression; a ``mocked`` rule (replaced by `with`) is never evaluated itself."""
        by_name = self.by_name
        reached: set[tuple[str, int]] = set()
        frontier = list(roots) if roots is not None else [self.entrypoint_rule]
        seen_rules: set[tuple[str, str]] = set(mocked)
        while frontier:
            key = frontier.pop()
            if key in seen_rules:
                continue
            seen_rules.add(key)
            for path, d in by_name.get(key, ()):
                if d.chain and not self._holds(hits, path, d, 1):
                    continue  # an else branch is tried only when every earlier branch failed
                reached.add((path, d.index))
                package = self.module_rules[path].package
                for k, expr in enumerate(d.body, start=1):
                    if not self._holds(hits, path, d, k):
                        break
                    frontier.extend(references(expr.text, package, by_name, self.aliases[path]))
        return reached

    def _name(self, path: str, d: RuleDef, k: int) -> str:
        m = self._module_index[path]
        return f"__regent_{m}_{d.index}_{k if k else 'done'}"

    @cached_property
    def _module_index(self) -> dict[str, int]:
        return {path: i for i, path in enumerate(self.module_rules)}

    def _holds(self, hits: set[str], path: str, d: RuleDef, k: int) -> bool:
        """Whether expression k (1-based) of ``d`` was evaluated: its prefix held."""
        if d.kind not in _PROBED_KINDS or path in self.skipped:
            return False
        if k == 1 and not d.chain:
            return True
        return self._name(path, d, k) in hits

    def _done(self, hits: set[str], path: str, d: RuleDef) -> bool:
        if d.kind not in _PROBED_KINDS or path in self.skipped:
            return False
        return self._name(path, d, 0) in hits

    def trace(self, hits: set[str], path: str, d: RuleDef, reached: set[tuple[str, int]]) -> dict[str, Any]:
        """One definition's body, expression by expression: held, undefined or not evaluated."""
        row: dict[str, Any] = {"file": path, "line": d.line, "rule": d.name}
        if d.rule_id:
            row["rule_id"] = d.rule_id
        if d.kind not in _PROBED_KINDS or path in self.skipped:
            row["result"] = "not traced"
            row["why"] = "function bodies are not traced" if d.kind == "function" else (
                self.skipped.get(path) or "a default rule has no body")
            return row
        evaluated = (path, d.index) in reached
        exprs = []
        for k, expr in enumerate(d.body, start=1):
            if not evaluated or not self._holds(hits, path, d, k):
                result = "not evaluated"
            elif self._holds_after(hits, path, d, k):
                result = "held"
            else:
                result = "undefined"
            exprs.append({"line": expr.line, "text": expr.text, "result": result})
        done = evaluated and self._done(hits, path, d)
        if done and d.value and f"__regent_{self._module_index[path]}_{d.index}_value" not in hits:
            done = False
            row["why"] = "its value is undefined (the body held)"
        row["result"] = "held" if done else ("undefined" if evaluated else "not evaluated")
        row["expressions"] = exprs
        return row

    def _holds_after(self, hits: set[str], path: str, d: RuleDef, k: int) -> bool:
        return self._done(hits, path, d) if k == len(d.body) else self._holds(hits, path, d, k + 1)

    def definitions(self) -> Iterable[tuple[str, RuleDef]]:
        for path, mr in self.module_rules.items():
            for d in mr.rules:
                yield path, d

    def line_coverage(self, hits: set[str], roots: Iterable[tuple[str, str]] | None = None,
                      mocked: frozenset[tuple[str, str]] = frozenset(),
                      paths: frozenset[str] | None = None) -> LineCoverage:
        """Lines evaluated (covered) and not, given the probes that held; ``roots`` and ``mocked``
        as for `reached`; only the modules in ``paths`` when given."""
        cov = LineCoverage()
        reached = self.reached(hits, roots, mocked)
        for path, d in self.definitions():
            if d.kind not in _PROBED_KINDS or path in self.skipped or (paths is not None and path not in paths):
                continue
            evaluated = (path, d.index) in reached
            cov.mark(path, [d.line], evaluated and self._done(hits, path, d))
            for k, expr in enumerate(d.body, start=1):
                lines = range(expr.line, expr.end_line + 1)
                cov.mark(path, lines, evaluated and self._holds(hits, path, d, k))
        return cov


@dataclass
class LineCoverage:
    """Covered / not-covered lines per file; merged across evaluations, rendered in OPA's shape."""

    covered: dict[str, set[int]] = field(default_factory=dict)
    seen: dict[str, set[int]] = field(default_factory=dict)

    def mark(self, path: str, lines: Iterable[int], covered: bool) -> None:
        rows = set(lines)
        self.seen.setdefault(path, set()).update(rows)
        if covered:
            self.covered.setdefault(path, set()).update(rows)

    def merge(self, other: LineCoverage) -> None:
        for path, rows in other.seen.items():
            self.seen.setdefault(path, set()).update(rows)
        for path, rows in other.covered.items():
            self.covered.setdefault(path, set()).update(rows)

    def report(self, display: dict[str, str] | None = None) -> dict[str, Any]:
        """`opa test --coverage`'s JSON: per file covered / not_covered row ranges, line counts and
        the percentage; the same three figures for all files together."""
        files: dict[str, Any] = {}
        total_cov = total_not = 0
        for path in sorted(self.seen):
            cov = self.covered.get(path, set())
            nots = self.seen[path] - cov
            entry: dict[str, Any] = {}
            if cov:
                entry["covered"] = _ranges(cov)
            if nots:
                entry["not_covered"] = _ranges(nots)
            entry["covered_lines"] = len(cov)
            entry["not_covered_lines"] = len(nots)
            entry["coverage"] = _percent(len(cov), len(nots))
            files[(display or {}).get(path, path)] = entry
            total_cov += len(cov)
            total_not += len(nots)
        return {
            "files": files,
            "covered_lines": total_cov,
            "not_covered_lines": total_not,
            "coverage": _percent(total_cov, total_not),
        }


def _percent(covered: int, not_covered: int) -> float:
    total = covered + not_covered
    return round(100.0 * covered / total, 2) if total else 100.0


def _ranges(rows: set[int]) -> list[dict[str, dict[str, int]]]:
    out: list[dict[str, dict[str, int]]] = []
    for row in sorted(rows):
        if out and out[-1]["end"]["row"] == row - 1:
            out[-1]["end"]["row"] = row
        else:
            out.append({"start": {"row": row}, "end": {"row": row}})
    return out


def import_aliases(lines: Iterable[str]) -> dict[str, str]:
    """`import data.a.b` → {"b": "data.a.b"}; `import data.a.b as c` → {"c": "data.a.b"}."""
    out: dict[str, str] = {}
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "import" and words[1].startswith("data."):
            alias = words[3] if len(words) >= 4 and words[2] == "as" else words[1].rsplit(".", 1)[-1]
            out[alias] = words[1]
    return out


def references(text: str, package: str, by_name: Mapping[tuple[str, str], Any],
               imports: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The rules (package, name) an expression names: `data.pkg.rule…`, a rule of its own
    package, or (given the module's ``imports``, alias → `data.…` ref) `alias.rule…`."""
    found = []
    for m in _IDENT.finditer(text):
        ref = m.group()
        head = ref.split(".", 1)[0]
        if imports and head in imports and imports[head].startswith("data."):
            ref = imports[head] + ref[len(head) :]
        if ref.startswith("data."):
            parts = ref[len("data.") :].split(".")
            for cut in range(len(parts) - 1, 0, -1):
                key = (".".join(parts[:cut]), parts[cut])
                if key in by_name:
                    found.append(key)
                    break
        else:
            key = (package, ref.split(".", 1)[0])
            if key in by_name:
                found.append(key)
    return found


def instrument(modules: dict[str, str], entrypoint: str) -> Instrumented:
    """The instrumented twin of a bundle's modules (bundle path → source)."""
    module_rules: dict[str, ModuleRules] = {}
    skipped: dict[str, str] = {}
    for path, source in modules.items():
        try:
            module_rules[path] = read_rules(source)
        except (ValueError, IndexError) as exc:
            module_rules[path] = ModuleRules("", (), ())
            skipped[path] = f"this module could not be read for probes ({exc})"
    tag = hashlib.sha256("\0".join(sorted(modules)).encode()).hexdigest()[:10]
    collector_package = f"regent_probe_{tag}"
    probes: dict[str, tuple[str, int, int]] = {}
    probe_package: dict[str, str] = {}
    out = dict(modules)
    hits_lines = [f"package {collector_package}", "import rego.v1", ""]
    rule_eps: dict[str, tuple[str, str]] = {}
    for m, (path, mr) in enumerate(module_rules.items()):
        if path in skipped or not mr.package:
            continue
        lines = [f"package {mr.package}", *mr.imports, ""]
        same_body: dict[str, str] = {}
        done_name = {d.index: f"__regent_{m}_{d.index}_done" for d in mr.rules}
        for d in mr.rules:
            if d.kind not in _PROBED_KINDS:
                continue
            guards = [f"not {done_name[c]}" for c in d.chain]
            exprs = [e.text for e in d.body]
            for k in range(1, len(exprs) + 2):
                if k == 1 and not guards and exprs:
                    continue  # the first expression is evaluated whenever the rule is
                prefix = guards + exprs[: k - 1]
                name = done_name[d.index] if k == len(exprs) + 1 else f"__regent_{m}_{d.index}_{k}"
                body = "\n\t".join(prefix) if prefix else "true"
                first = same_body.setdefault(body, name)
                if first != name:  # the same prefix again (`input.target == "shell"`): one evaluation
                    lines += [f"{name} if {first}", ""]
                else:
                    lines += [f"{name} if {{", f"\t{body}", "}", ""]
                probes[name] = (path, d.index, 0 if k == len(exprs) + 1 else k)
                probe_package[name] = mr.package
                hits_lines.append(f'hits contains "{name}" if data.{mr.package}.{name}')
            if d.value:
                # The body can hold while the head's value is undefined (`t := time.parse_…(x)`
                # on a time rego-cpp cannot parse): then the definition gives nothing, and the
                # trace must not call it held.
                name = f"__regent_{m}_{d.index}_value"
                # (rego-cpp holds `_ = (undefined)`: the value goes through a variable.)
                body = "\n\t".join([*guards, *exprs, f"__regent_v := ({d.value})", "__regent_v == __regent_v"])
                lines += [f"{name} if {{", f"\t{body}", "}", ""]
                probes[name] = (path, d.index, -1)
                probe_package[name] = mr.package
                hits_lines.append(f'hits contains "{name}" if data.{mr.package}.{name}')
        for d in mr.rules:
            if d.kind in ("complete", "multi"):
                rule_eps.setdefault(f"{mr.package.replace('.', '/')}/{d.name}", (path, d.name))
        out[_probe_path(path)] = "\n".join(lines) + "\n"
    if len(hits_lines) == 3:
        hits_lines.append("hits := set()")
    segments = entrypoint.split("/")
    entry_rule = (".".join(segments[:-1]), segments[-1])
    # One query for the decision and the hits: the entrypoint's value (a one-element array, or
    # none when undefined) beside the probe names that held.
    hits_lines.append(f'result := {{"value": [x | x := data.{".".join(segments)}], "hits": hits}}')
    collector_path = f"{collector_package}.rego"
    out[collector_path] = "\n".join(hits_lines) + "\n"
    eps = (
        f"{collector_package}/result",
        f"{collector_package}/hits",
        *(f"{probe_package[n].replace('.', '/')}/{n}" for n in probes),
        *rule_eps,
    )
    return Instrumented(
        modules=out,
        entrypoints=eps,
        collector=f"{collector_package}/hits",
        combined=f"{collector_package}/result",
        probes=probes,
        rule_entrypoints=rule_eps,
        module_rules=module_rules,
        entrypoint_rule=entry_rule,
        skipped=skipped,
        probe_package=probe_package,
    )


def _probe_path(path: str) -> str:
    return path[: -len(".rego")] + ".regent-probes.rego" if path.endswith(".rego") else path + ".probes"
