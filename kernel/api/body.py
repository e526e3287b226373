"""Strict request bodies: size-capped, one JSON value, unknown keys and wrong types → 400.

Submit bodies are parsed keeping number lexemes inside `args`, because a step's identity is the
hash of their exact text (rebuno-v0 §1.2).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request

from kernel.errors import invalid
from kernel.identity import MAX_INT_DIGITS
from kernel.ids import whole_number
from kernel.text import text_problem

M = TypeVar("M", bound=BaseModel)


def _name(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A string field that names something (ids, keys, secrets, URLs, targets): NUL and lone
# surrogates are a 400 (docs/api.md, "Text"). The served document says so (a lone surrogate has no
# pattern every regex dialect reads alike, so only NUL), so a client built from it sends neither.
NO_NUL = "^[^\\u0000]*$"
Name = Annotated[str, AfterValidator(_name), WithJsonSchema({"type": "string", "pattern": NO_NUL})]


def text_field(low: int, high: int | None, pattern: str = NO_NUL) -> Any:
    """A Name of `low`-`high` characters, documented with its bounds (the route or core checks them)."""
    bounds = {"minLength": low, **({"maxLength": high} if high is not None else {})}
    return Annotated[str, AfterValidator(_name), WithJsonSchema({"type": "string", "pattern": pattern, **bounds})]


def whole(low: int, high: int) -> Any:
    """An integer documented with the bounds its route or the core checks."""
    return Annotated[int, WithJsonSchema({"type": "integer", "minimum": int(low), "maximum": int(high)})]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    declared = whole_number(request.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise BodyTooLarge()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


class _Number(str):
    """A JSON number kept as its source lexeme."""

    __slots__ = ()


def _int(text: str) -> int:
    _check_digits(text)
    return int(text)


def _int_lexeme(text: str) -> _Number:
    _check_digits(text)
    return _Number(text)


def _check_digits(text: str) -> None:
    if len(text) > MAX_INT_DIGITS and len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise invalid(f"an integer has more than {MAX_INT_DIGITS} digits")


def loads_json(raw: bytes, *, lexical: bool = False) -> Any:
    if not raw.strip():
        raise invalid("empty body")
    try:
        text = raw.decode("utf-8")
        decoder = _LEXICAL if lexical else _DECODER
        # Only the first JSON value is read (as Rebuno does); trailing bytes are rejected below
        # unless they are whitespace — Regent chooses the stricter reading (docs/api.md).
        value, end = decoder.raw_decode(text.lstrip())
        if text.lstrip()[end:].strip():
            raise invalid("trailing data after the JSON body")
        return value
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise invalid("JSON body nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise invalid(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise invalid(f"number {text[:40]} is out of range")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise invalid(f"duplicate key {dup[:80]!r} in the JSON body")
    return out


class _Duplicated(dict[str, Any]):
    """An object of a lexical body that had a duplicate key (the last one kept)."""

    __slots__ = ()


def _lexical_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Inside a step's `args` duplicates are part of the identity contract (the last wins,
    # rebuno-v0 §1.2); `parse_model` refuses them in the body's own keys.
    out = dict(pairs)
    return out if len(out) == len(pairs) else _Duplicated(out)


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite, parse_int=_int,
                            object_pairs_hook=_object)
_LEXICAL = json.JSONDecoder(parse_int=_int_lexeme, parse_float=_Number, parse_constant=_no_constant,
                            object_pairs_hook=_lexical_object)


def dumps_lexical(value: Any) -> str:
    """Serialise a value parsed with `lexical=True` back to JSON text, lexemes intact."""
    parts: list[str] = []
    _emit(value, parts)
    return "".join(parts)


def _emit(v: Any, out: list[str]) -> None:
    if isinstance(v, _Number):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, dict):
        out.append("{")
        for i, (k, item) in enumerate(v.items()):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _emit(item, out)
        out.append("}")
    elif isinstance(v, list):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _emit(item, out)
        out.append("]")
    else:  # pragma: no cover - the decoder produces nothing else
        out.append(json.dumps(v))


def parse_model(model: type[M], raw: bytes, *, lexical: bool = False, allow_empty: bool = False) -> M:
    if allow_empty and not raw.strip():
        value: Any = {}
    else:
        value = loads_json(raw, lexical=lexical)
    if not isinstance(value, dict):
        raise invalid("body must be a JSON object")
    if isinstance(value, _Duplicated):
        raise invalid("duplicate key in the JSON body")
    try:
        return model.model_validate(value)
    except PydanticValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = f'unknown field "{where}"'
        else:
            msg = f"{where}: {err.get('msg')}"
        raise invalid(msg) from None
