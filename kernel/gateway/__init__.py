"""The OpenAI-compatible gateway: records LLM calls as `llm_call` steps over the kernel's HTTP API."""

from kernel.gateway.app import create_gateway_app

__all__ = ["create_gateway_app"]
