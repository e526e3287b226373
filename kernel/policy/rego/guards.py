"""Built-in calls rego-cpp never returns from on an empty argument, routed at load through helper
functions (appended to the module, same package) that give OPA's answer or fail fast. Pure.

Measured on rego-cpp 1.5.2 (each in a subprocess, 5 s bound): `replace(s, "", y)`,
`strings.replace_n({"": y, …}, s)`, `regex.split(p, s)` with a pattern matching the empty string
(`""`, `x*`, `^`, `\\b`), `regex.template_match(t, s, "", "")`, `yaml.unmarshal("")` and
`yaml.is_valid("")` never return. A literal `""` times the compiler out; one from input makes
every evaluation wait out the evaluation timeout and kills the worker that ran it. The same call
with any other argument returns at once (`split(s, "")`, `indexof`, `trim*`, `strings.count`,
`substring`, `concat` with `""` do too), so the helpers test the argument first:

- `replace(s, "", y)`: OPA inserts `y` before each character and at the end; the helper builds
  that from `split(s, "")` and `concat` (both return on `""`).
- `strings.replace_n`: `{"": y}` alone is `replace(s, "", y)`; `""` beside other keys (OPA then
  inserts `y` at every position a longer key does not cover) is an evaluation error.
- `regex.split`: a pattern with an empty match in `s` (found with `regex.find_n`, which returns)
  is an evaluation error; OPA's answer needs match positions no rego-cpp built-in gives.
- `regex.template_match` with an empty delimiter: undefined (OPA: an error, undefined unless
  strict). `yaml.unmarshal("")` is `null`, `yaml.is_valid("")` is `true`, as in OPA.

Not a hang, but the same kind of fix: `sprintf("%s", [x])` where `x` comes from `concat`, `upper`,
`lower`, `replace`, `regex.replace`, `format_int` or `json.marshal` printed `x` with its JSON quotes
(`sprintf("denied: %s", [concat(", ", xs)])` gave `denied: "a, b"` with unescaped quotes, which the
kernel cannot read: every evaluation was an `eval-error`). String arguments go through
`trim_prefix(x, "")`, which gives the same text as a plain string.

An evaluation error is made by a function giving two values (a conflict): rego-cpp reports it
whatever the strict setting, and the kernel denies the step with `eval-error`.
"""

from __future__ import annotations

from .scan import scan_module
from .v0_syntax import tokens

__all__ = ["GUARDED", "guard_builtins"]

_P = "__regent_guard_"
_FAIL = "regent: {what} is not supported (rego-cpp never returns from it)"

# builtin → (helper name, helper definitions, what the note says)
GUARDED: dict[str, tuple[str, str, str]] = {
    "replace": (
        f"{_P}replace",
        f'{_P}replace(s, old, new) := replace(s, old, new) if old != ""\n'
        f'{_P}replace(s, old, new) := concat(new, array.concat(array.concat([""], split(s, "")), [""])) '
        'if old == ""\n',
        'an empty `old` inserts `new` around every character, as in OPA',
    ),
    "strings.replace_n": (
        f"{_P}replace_n",
        f"{_P}replace_n(p, s) := strings.replace_n(p, s) if not {_P}empty_key(p)\n"
        f'{_P}replace_n(p, s) := {_P}replace(s, "", p[""]) if {{ {_P}empty_key(p); count(p) == 1 }}\n'
        f'{_P}replace_n(p, s) := "{_FAIL.format(what="strings.replace_n with an empty key beside others")}" '
        f"if {{ {_P}empty_key(p); count(p) > 1 }}\n"
        f"{_P}replace_n(p, s) := false if {{ {_P}empty_key(p); count(p) > 1 }}\n"
        f'{_P}empty_key(p) if {{ is_object(p); "" in object.keys(p) }}\n',
        'an empty key alone acts as `replace(s, "", v)`; beside other keys it is an evaluation error',
    ),
    "regex.split": (
        f"{_P}regex_split",
        f"{_P}regex_split(p, s) := regex.split(p, s) if not {_P}empty_match(p, s)\n"
        f'{_P}regex_split(p, s) := "{_FAIL.format(what="regex.split with a pattern matching the empty string")}" '
        f"if {_P}empty_match(p, s)\n"
        f"{_P}regex_split(p, s) := false if {_P}empty_match(p, s)\n"
        f'{_P}empty_match(p, s) if "" in regex.find_n(p, s, -1)\n',
        "a pattern that matches the empty string in `s` is an evaluation error",
    ),
    "regex.template_match": (
        f"{_P}template_match",
        f"{_P}template_match(t, s, a, b) := regex.template_match(t, s, a, b) if {{ a != \"\"; b != \"\" }}\n",
        "an empty delimiter is undefined (OPA: an error)",
    ),
    "yaml.unmarshal": (
        f"{_P}yaml_unmarshal",
        f'{_P}yaml_unmarshal(s) := null if s == ""\n'
        f'{_P}yaml_unmarshal(s) := yaml.unmarshal(s) if s != ""\n',
        '`yaml.unmarshal("")` is null, as in OPA',
    ),
    "sprintf": (
        f"{_P}sprintf",
        f"{_P}sprintf(f, args) := sprintf(f, [{_P}str(a) | some a in args]) if is_array(args)\n"
        f"{_P}sprintf(f, args) := sprintf(f, args) if not is_array(args)\n"
        f'{_P}str(x) := trim_prefix(x, "") if is_string(x)\n'
        f"{_P}str(x) := x if not is_string(x)\n",
        "string arguments are passed as plain strings (rego-cpp printed the results of `concat`, "
        "`upper`, `lower`, `replace`, `format_int`, … with their quotes)",
    ),
    "yaml.is_valid": (
        f"{_P}yaml_is_valid",
        f'{_P}yaml_is_valid(s) if s == ""\n'
        f'{_P}yaml_is_valid(s) := yaml.is_valid(s) if s != ""\n',
        '`yaml.is_valid("")` is true, as in OPA',
    ),
}
_NEEDS = {"strings.replace_n": ("replace",)}  # helpers a helper calls


def _calls(source: str) -> list[tuple[int, int, int, int, str]]:
    """(start, end, line, col, builtin) of each call of a guarded built-in, in source order."""
    toks = tokens(source)
    local = scan_module(source).heads
    out = []
    for j, t in enumerate(toks):
        if t.kind != "ident" or (j > 0 and toks[j - 1].text == "."):
            continue
        k, name = j, t.text
        while k + 2 < len(toks) and toks[k + 1].text == "." and toks[k + 2].kind == "ident":
            k += 2
            name += "." + toks[k].text
        if name in GUARDED and name not in local and k + 1 < len(toks) and toks[k + 1].text == "(":
            out.append((t.start, toks[k].end, t.line, t.col, name))
    return out


def guard_notes(source: str) -> list[tuple[int, int, str]]:
    """(line, col, note) for each guarded call in the author's text."""
    return [(line, col, f"`{name}(…)` runs through a guard: {GUARDED[name][2]}")
            for _s, _e, line, col, name in _calls(source)]


def guard_builtins(source: str) -> str:
    """``source`` with each guarded call renamed to its helper and the helpers appended after the
    last line (so every line of the author's text keeps its number)."""
    calls = _calls(source)
    if not calls:
        return source
    out = source
    for start, end, _line, _col, name in reversed(calls):
        out = out[:start] + GUARDED[name][0] + out[end:]
    used = {name for *_, name in calls}
    used |= {n for name in list(used) for n in _NEEDS.get(name, ())}
    helpers = "".join(GUARDED[name][1] for name in GUARDED if name in used)
    return out + ("" if out.endswith("\n") else "\n") + helpers
