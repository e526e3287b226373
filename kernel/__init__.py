"""Regent: a policy-engine-centric durable kernel for AI agents (Rebuno v0 API)."""

__version__ = "0.1.0"
