"""Token usage from a recorded llm_call result (rebuno-v0 §7.6): OpenAI, Anthropic, Gemini, Ollama,
whole responses or server-sent event streams."""

from __future__ import annotations

import json
import math
from typing import Any

_INPUT_KEYS = frozenset({"prompt_tokens", "input_tokens", "inputTokens", "promptTokenCount", "prompt_eval_count"})
_OUTPUT_KEYS = frozenset(
    {"completion_tokens", "output_tokens", "outputTokens", "candidatesTokenCount", "eval_count"}
)
_MAX_NODES = 200_000  # bound the scan: a hostile result cannot make completion slow
# One call's count is capped so the BIGINT meter (a sum over steps) cannot overflow: a trillion is
# far beyond any real call and leaves room for millions of steps below 2**63.
_MAX_TOKENS = 10**12


def parse_usage(result: Any) -> tuple[int, int] | None:
    """(input_tokens, output_tokens), or None when nothing was found."""
    payload: Any = result
    if isinstance(result, dict) and isinstance(result.get("body"), str) and result["body"]:
        payload = _decode(result["body"])
    best = [0, 0]
    _scan(payload, best)
    return (best[0], best[1]) if best[0] > 0 or best[1] > 0 else None


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    docs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if not data or data == "[DONE]":
            continue
        try:
            docs.append(json.loads(data))
        except ValueError:
            continue
    return docs


def _scan(root: Any, best: list[int]) -> None:
    stack = [root]
    seen = 0
    while stack and seen < _MAX_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    if isinstance(value, float) and not math.isfinite(value):
                        continue  # `1e400`, NaN, Infinity decode to floats int() cannot take
                    n = min(int(value), _MAX_TOKENS)
                    if key in _INPUT_KEYS:
                        best[0] = max(best[0], n)
                    elif key in _OUTPUT_KEYS:
                        best[1] = max(best[1], n)
                elif isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
