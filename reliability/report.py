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

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return not self.skipped and bool(self.checks) and all(c.ok for c in self.checks)


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
            held = "\n".join(("[green]✓[/] " if c.ok else "[red]✗[/] ") + c.name + (f": {c.detail}" if c.detail else "")
                             for c in o.checks)
        figs = "\n".join(f"{k}: {v}" for k, v in o.figures.items())
        t.add_row(verdict, f"{o.scenario} {o.title}", o.tried, held, figs, f"{o.seconds:.0f}")
    console.print(t)
