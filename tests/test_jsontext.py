"""kernel.jsontext: the reused C encoder writes what json.JSONEncoder writes, and refuses alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernel.jsontext import compact_encoder

VALUES: list[Any] = [
    {"a": [1, 2.5, None, True, False, "é"], "b": {"c": "x\n\"q\""}},
    "a string é", "\ud800", 1, -0.0, 1e300, 10**40, None, [], {}, {1: 2, "k": [{}]},
    {"nested": [[[[{"deep": "ü\u2028"}]]]]},
]


@pytest.mark.parametrize("ascii_only", [False, True])
@pytest.mark.parametrize("value", VALUES)
def test_the_text_is_json_encoders(value: Any, ascii_only: bool) -> None:
    ref = json.JSONEncoder(ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False)
    assert compact_encoder(ascii_only)(value) == ref.encode(value)


@pytest.mark.parametrize("bad, error", [(float("nan"), ValueError), ({"x": float("inf")}, ValueError),
                                        ({"x": object()}, TypeError), ({(1, 2): 1}, TypeError)])
def test_what_json_refuses_it_refuses(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        compact_encoder(False)(bad)
