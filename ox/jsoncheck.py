"""Refuse, at enqueue, values that would not come back unchanged from a JSON column."""

import math
import sys
from typing import Any

from django.utils.json import normalize_json

from ox.exceptions import ArgumentsNotJSON


def _text_problem(text: str) -> str | None:
    # PostgreSQL's jsonb cannot store U+0000 or a lone surrogate; refuse both everywhere alike.
    if "\x00" in text:
        return "contains a NUL character (U+0000), which jsonb cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not valid Unicode text"
    return None


def _plain(text: str) -> bool:
    return text.isascii() and "\x00" not in text or _text_problem(text) is None


def json_problem(value: Any, path: str) -> str | None:
    """Describe the first part of `value` that JSON cannot round-trip, or None."""
    if isinstance(value, str):
        problem = _text_problem(value)
        return f"{path} {problem}" if problem else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if value.bit_length() < _BIG_INT_BITS:
            return None
        try:
            str(value)
        except ValueError:
            return f"{path} is an integer too long to write as JSON (over {sys.get_int_max_str_digits()} digits)"
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
            key_problem = _text_problem(key)
            if key_problem:
                return f"{path} has a key that {key_problem}"
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON"


def ensure_json(value: Any, path: str) -> None:
    problem = json_problem(value, path)
    if problem:
        raise ArgumentsNotJSON(f"Task arguments must survive a JSON round trip: {problem}.")


_SCALARS = (type(None), bool)
_BIG_INT_BITS = 13_000  # about 3,900 digits: below Python's default int-to-text limit


def jsonable(value: Any, path: str) -> Any:
    """`value` as it will come back from JSON (tuples become lists), checked on the way in
    one walk; ArgumentsNotJSON names the first part that would not survive."""
    kind = type(value)
    if kind in _SCALARS or (kind is str and _plain(value)) or (kind is int and value.bit_length() < _BIG_INT_BITS):
        return value
    if kind is list or kind is tuple:
        return [jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind is dict and all(type(k) is str and _plain(k) for k in value):
        return {k: jsonable(v, f"{path}[{k!r}]") for k, v in value.items()}
    if kind is float and math.isfinite(value):
        return value
    # Subclasses (an IntEnum, a str subclass...) and every refusal take the careful path.
    ensure_json(value, path)
    return normalize_json(value)
