"""Refuse, at enqueue, values that would not come back unchanged from a JSON column."""

import math
from typing import Any

from django.utils.json import normalize_json

from ox.exceptions import ArgumentsNotJSON


def json_problem(value: Any, path: str) -> str | None:
    """Describe the first part of `value` that JSON cannot round-trip, or None."""
    if isinstance(value, str):
        # PostgreSQL's jsonb cannot store U+0000; refuse it on every database alike.
        return f"{path} contains a NUL character (U+0000), which jsonb cannot store" if "\x00" in value else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot represent"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r} of type {type(key).__name__}; JSON keys are strings"
            if "\x00" in key:
                return f"{path} has a key with a NUL character (U+0000), which jsonb cannot store"
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON"


def ensure_json(value: Any, path: str) -> None:
    problem = json_problem(value, path)
    if problem:
        raise ArgumentsNotJSON(f"Task arguments must survive a JSON round trip: {problem}.")


_SCALARS = (type(None), bool, int)


def jsonable(value: Any, path: str) -> Any:
    """`value` as it will come back from JSON (tuples become lists), checked on the way in
    one walk; ArgumentsNotJSON names the first part that would not survive."""
    kind = type(value)
    if kind in _SCALARS or (kind is str and "\x00" not in value):
        return value
    if kind is list or kind is tuple:
        return [jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind is dict and all(type(k) is str and "\x00" not in k for k in value):
        return {k: jsonable(v, f"{path}[{k!r}]") for k, v in value.items()}
    if kind is float and math.isfinite(value):
        return value
    # Subclasses (an IntEnum, a str subclass...) and every refusal take the careful path.
    ensure_json(value, path)
    return normalize_json(value)
