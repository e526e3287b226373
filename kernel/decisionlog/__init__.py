"""Decision logs (docs/policy-rollout.md): every policy decision as an OPA-shaped JSON entry,
masked, shipped to a rotating file, stdout and/or an HTTP endpoint off the hot path."""

from __future__ import annotations

from typing import Any

from kernel.decisionlog.log import DecisionLog, DecisionLogCollector, encode_entry
from kernel.decisionlog.mask import MaskRule, apply_masks, parse_mask_rules
from kernel.decisionlog.sinks import FileSink, HttpSink, StdoutSink

__all__ = [
    "DecisionLog",
    "DecisionLogCollector",
    "FileSink",
    "HttpSink",
    "MaskRule",
    "StdoutSink",
    "apply_masks",
    "build_decision_log",
    "encode_entry",
    "parse_mask_rules",
]


def build_decision_log(settings: Any) -> DecisionLog | None:
    """The decision log the settings ask for; None when no sink is configured."""
    sinks: list[Any] = []
    if settings.decision_log_file:
        sinks.append(FileSink(settings.decision_log_file, max_bytes=settings.decision_log_file_max_bytes,
                              backups=settings.decision_log_file_backups))
    if settings.decision_log_console:
        sinks.append(StdoutSink())
    if settings.decision_log_url:
        token = settings.decision_log_token.get_secret_value() if settings.decision_log_token else None
        sinks.append(HttpSink(
            settings.decision_log_url, token=token, buffer_size=settings.decision_log_buffer_size,
            batch_size=settings.decision_log_batch_size, flush_interval=settings.decision_log_flush_interval,
            timeout=settings.decision_log_timeout, retry_min_delay=settings.decision_log_retry_min_delay,
            retry_max_delay=settings.decision_log_retry_max_delay,
        ))
    if not sinks:
        return None
    return DecisionLog(sinks, masks=parse_mask_rules(settings.decision_log_mask),
                       buffer_size=settings.decision_log_buffer_size,
                       labels={"app": "regent", "id": settings.replica_id, "version": "0.1.0"})
