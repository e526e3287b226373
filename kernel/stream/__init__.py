"""The live stream side channel (rebuno-v0 §10): best-effort deltas, never persisted."""

from kernel.stream.broker import InProcessBroker, StreamBroker

__all__ = ["InProcessBroker", "StreamBroker"]
