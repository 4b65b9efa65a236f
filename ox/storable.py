"""Make what ox writes storable on every database: text without NUL or lone surrogates,
return values as the JSON Django's own backends would store, or a clear refusal."""

import json
from typing import Any

from django.utils.json import normalize_json

from ox.jsoncheck import json_problem


class NotStorable(ValueError):
    """A value the database cannot hold. Deterministic: retrying the attempt cannot help."""


def storable_text(text: str) -> str:
    """`text` with NUL and lone surrogates (what os.fsdecode gives for undecodable bytes)
    written out as backslash escapes, so PostgreSQL and SQLite both accept it."""
    if text.isascii():
        return text.replace("\x00", "\\x00") if "\x00" in text else text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")


MAX_RESULT_CHARS = 64 * 1024 * 1024  # a jsonb value holds at most 255 MB; a batch far less


def return_json(value: Any) -> str:
    """The JSON text stored for a task's return value: Django's normalize_json() (tuples
    become lists), then JSON (int keys become strings), as Django's database backends store
    it. Raises NotStorable for what no database column can hold."""
    if value is None:
        return "null"
    try:
        normalized = normalize_json(value)
        # ensure_ascii=False: a lone surrogate stays raw, so encoding finds it below.
        text = json.dumps(normalized, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotStorable(f"the return value cannot be stored as JSON: {exc}") from exc
    if len(text) > MAX_RESULT_CHARS:
        size = f"{len(text):,} characters of JSON"
        raise NotStorable(f"the return value is {size}; ox stores at most {MAX_RESULT_CHARS:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotStorable("the return value contains a lone surrogate, which no database stores as text") from None
    if "\\u0000" in text:
        problem = json_problem(json.loads(text), "the return value")
        if problem:
            raise NotStorable(problem)
    return text
