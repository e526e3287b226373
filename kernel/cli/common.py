"""What every command group shares: the stderr console and the one reading of the settings."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console

from kernel.errors import ConfigError

if TYPE_CHECKING:
    from kernel.config import Settings

console = Console(stderr=True, soft_wrap=True)  # no hard wraps: log collectors read whole lines


def settings_from(args: argparse.Namespace, **forced: object) -> Settings:
    # Imported here: pydantic-settings is a large import that `regent policy …` does not need.
    from pydantic import ValidationError as SettingsError

    from kernel.config import Settings

    overrides = {k: v for k, v in forced.items() if v is not None}
    for name in ("db_url", "host", "port", "config"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "mcp", False):
        overrides["mcp_in_kernel"] = True
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None
