"""What a scenario returns: what it tried, what held, its figures; and the table that shows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    items: list[str] = field(default_factory=list)  # what failed, one entry per case
    known: list[str] = field(default_factory=list)  # failed items that are known open defects


@dataclass
class Outcome:
    scenario: str  # R1 … R6
    title: str
    tried: str = ""
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str = ""  # why it did not run (a missing service), never a pass
    details: dict[str, Any] = field(default_factory=dict)  # for --json: every case and failure

    def check(self, name: str, ok: bool, detail: str = "", items: list[str] | None = None) -> bool:
        self.checks.append(Check(name, bool(ok), detail, list(items or [])))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return not self.skipped and bool(self.checks) and all(c.ok for c in self.checks)


def _line(c: Check) -> str:
    if c.ok and c.known:
        return f"[yellow]![/] {c.name}: known open: " + "; ".join(c.known[:4]) + (" …" if len(c.known) > 4 else "")
    return ("[green]✓[/] " if c.ok else "[red]✗[/] ") + c.name + (f": {c.detail}" if c.detail else "")


def apply_known(outcomes: list[Outcome], known: list[tuple[str, str]]) -> None:
    """A check whose every failed item matches a known open defect (substring → why) holds, marked
    as such; an item no pattern matches still fails it."""
    for o in outcomes:
        for c in o.checks:
            if c.ok or not c.items:
                continue
            hits = [f"{item} ({why})" for item in c.items for pattern, why in known if pattern in item]
            unknown = [item for item in c.items if not any(pattern in item for pattern, _ in known)]
            if not unknown:
                c.ok, c.known = True, hits
            else:
                c.detail = f"{len(unknown)}: " + "; ".join(unknown[:3]) + (" …" if len(unknown) > 3 else "")


def render(outcomes: list[Outcome], console: Console, profile: str) -> None:
    t = Table(title=f"regent chaos — {profile} profile", show_lines=True)
    t.add_column("", no_wrap=True)
    t.add_column("scenario")
    t.add_column("tried")
    t.add_column("survived")
    t.add_column("figures")
    t.add_column("s", justify="right")
    for o in outcomes:
        if o.skipped:
            verdict, held = "[yellow]SKIP[/]", o.skipped
        else:
            verdict = "[green]PASS[/]" if o.ok else "[red]FAIL[/]"
            held = "\n".join(_line(c) for c in o.checks)
        figs = "\n".join(f"{k}: {v}" for k, v in o.figures.items())
        t.add_row(verdict, f"{o.scenario} {o.title}", o.tried, held, figs, f"{o.seconds:.0f}")
    console.print(t)
