"""Registered agents: where to deliver, the shared secret, the lease period."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Agent:
    id: str
    webhook_url: str
    secret: str = field(repr=False)  # never returned, never logged
    registered_at: datetime
    lease_timeout_seconds: int | None = None
    description: str | None = None
    input_schema: Any = None
    output_schema: Any = None
