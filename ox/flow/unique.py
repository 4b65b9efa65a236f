"""Unique tasks: what makes two enqueues "the same task", and how a duplicate is answered.

A unique task's row carries `unique_key` (a hash of the task path, the chosen arguments and,
with a period, the window of time) and `unique_states` (which finished statuses keep holding
the key). The partial unique index ox_task_unique (migration 0013) covers every row whose key
is held: always while READY or RUNNING (a task that can still run must never have a twin:
the pitfall of letting unique states omit a live state), and in SUCCESSFUL, FAILED or
CANCELLED when its unique_states say so. A status change moves the row in or out of the
index by itself, so no write path has to remember to free a key; an insert of a held key is
refused by the index, never by a check-then-insert race.

With a period the window is part of the key: one task per window, so a task still READY from
the last window does not refuse the same call in the next one (as Oban's and River's periods).
"""

import functools
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from django.tasks import TaskResult
from django.tasks.exceptions import InvalidTask

from ox.metadata import OxTaskResult

# Finished statuses a key may keep holding, as bits of unique_states.
HOLD_BITS = {"SUCCESSFUL": 1, "FAILED": 2, "CANCELLED": 4}
LIVE = ("READY", "RUNNING")
ALL_STATES = (*LIVE, *HOLD_BITS)

OnDuplicate = Literal["return", "raise"]
MIN_PERIOD, MAX_PERIOD = 0.001, 100 * 365.25 * 86400


@dataclass(frozen=True, slots=True)
class Unique:
    """A task's uniqueness. by: the argument names (keyword) or positions (int) that make the
    key, None for all arguments; key: a key given outright (then `by` is not used); period:
    unique within windows of this length (seconds or a timedelta, aligned to the Unix epoch),
    None for as long as a row holds the key; states: the statuses in which an existing task
    refuses a duplicate (READY and RUNNING always); on_duplicate: "return" the existing
    task's result (ox.is_duplicate() tells it apart) or "raise" ox.DuplicateTask."""

    by: tuple[str | int, ...] | None = None
    key: str | None = None
    period: float | None = None
    states: tuple[str, ...] = LIVE
    on_duplicate: OnDuplicate = "return"

    def __post_init__(self) -> None:
        if self.by is not None:
            by = (self.by,) if isinstance(self.by, (str, int)) else tuple(self.by)
            for name in by:
                if isinstance(name, bool) or not isinstance(name, (str, int)) or (isinstance(name, int) and name < 0):
                    raise InvalidTask(f"unique by= takes argument names or positions, got {name!r}")
            object.__setattr__(self, "by", by)
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise InvalidTask(f"unique key must be a non-empty string, got {self.key!r}")
        if self.period is not None:
            period = self.period.total_seconds() if isinstance(self.period, timedelta) else self.period
            if isinstance(period, bool) or not isinstance(period, (int, float)) or not math.isfinite(period):
                raise InvalidTask(f"unique period must be seconds or a timedelta, got {self.period!r}")
            if not MIN_PERIOD <= period <= MAX_PERIOD:
                raise InvalidTask(f"unique period must be from 1 ms to 100 years (in seconds), got {self.period!r}")
            object.__setattr__(self, "period", float(period))
        states = (self.states,) if isinstance(self.states, str) else tuple(self.states)
        unknown = [s for s in states if s not in ALL_STATES]
        if unknown:
            raise InvalidTask(f"unique states: {unknown!r} not among {', '.join(ALL_STATES)}")
        # READY and RUNNING always hold: a state a live task can be in that let a duplicate in
        # would let two copies run (River's and Oban's pitfall).
        object.__setattr__(self, "states", tuple(s for s in ALL_STATES if s in LIVE or s in states))
        if self.on_duplicate not in ("return", "raise"):
            raise InvalidTask(f"unique on_duplicate must be 'return' or 'raise', got {self.on_duplicate!r}")

    @property
    def hold_bits(self) -> int:
        return sum(bit for state, bit in HOLD_BITS.items() if state in self.states)


def as_unique(value: Any) -> Unique | None:
    """@task(unique=...) and .using(unique=...): True (all arguments), a Unique, a dict of its
    fields, or None/False."""
    if value is None or value is False:
        return None
    if value is True:
        return Unique()
    if isinstance(value, Unique):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(Unique)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise InvalidTask(f"unique: unknown option {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return Unique(**value)
    raise InvalidTask(f"unique must be True, a dict or ox.Unique, got {value!r}")


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def _plain(func: Callable[..., Any], context: bool) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """(names, defaults) of a function whose parameters are all positional-or-keyword (the
    common case, bound here without inspect's bind()); None for any other signature."""
    sig = _signature(func)
    if sig is None:
        return None
    params = list(sig.parameters.values())[1 if context else 0 :]
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params), {p.name: p.default for p in params if p.default is not p.empty}


def bound(task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call as the function sees it, name -> value, defaults filled in: f(1) and f(n=1)
    are one call. None when the function has no signature to bind to, or the call does not
    fit it (the task will fail when it runs; its key is then the arguments as given)."""
    func = getattr(task, "func", None)
    sig = _signature(func) if func is not None else None
    if sig is None:
        return None
    context = bool(getattr(task, "takes_context", False))
    plain = _plain(func, context)
    if plain is not None:
        names, defaults = plain
        if len(args) > len(names):
            return None
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in values or name not in names:
                return None
            values[name] = value
        for name in names:
            if name not in values:
                if name not in defaults:
                    return None
                values[name] = _default(name, defaults[name])
        return values
    try:
        call = sig.bind(*([None] if context else []), *args, **kwargs)
    except TypeError:
        return None
    given = set(call.arguments)
    call.apply_defaults()
    values = {k: v if k in given else _default(k, v) for k, v in call.arguments.items()}
    if context:
        values.pop(next(iter(sig.parameters)), None)
    return values


def _default(name: str, value: Any) -> Any:
    """A default filled in by bound(): itself when JSON can say it, else a marker naming the
    parameter (the same in every process: a sentinel's repr() holds its address)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return f"<default of {name}>"
    return value


def _positional_name(task: Any, index: int) -> str | None:
    func = getattr(task, "func", None)
    sig = _signature(func) if func is not None else None
    if sig is None:
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in sig.parameters.values() if p.kind in kinds]
    names = names[1:] if getattr(task, "takes_context", False) else names
    return names[index] if index < len(names) else None


def _pick(
    args: Sequence[Any],
    kwargs: dict[str, Any],
    call: dict[str, Any] | None,
    by: tuple[str | int, ...],
    what: str,
    task: Any = None,
) -> list[Any]:
    picked = []
    for name in by:
        if isinstance(name, int):
            # A position names the parameter there, so f(1) and f(n=1) pick the same value.
            named = _positional_name(task, name) if call is not None else None
            if named is not None and named in call:  # type: ignore[operator]
                picked.append(call[named])  # type: ignore[index]
                continue
            if name >= len(args):
                raise InvalidTask(f"{what} uses positional argument {name}, but the call has {len(args)}")
            picked.append(args[name])
        elif call is not None and name in call:
            picked.append(call[name])
        elif name in kwargs:
            picked.append(kwargs[name])
        else:
            raise InvalidTask(f"{what} uses argument {name!r}, which the call does not pass")
    return picked


# Defaults filled in by bound() may be values JSON cannot say (a default datetime): their
# repr() stands for them, the same for every call. One encoder for every call: json.dumps()
# with options builds a new one each time, a third of what a key costs.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)


def _text(value: Any) -> str:
    return _ENCODER.encode(value)


def unique_key(
    unique: Unique, task: Any, args: Sequence[Any], kwargs: dict[str, Any], now: datetime
) -> tuple[str, datetime | None]:
    """The key (64 hex digits) and, with a period, when its window ends. Arguments are
    already JSON-normalised (ox.jsoncheck), and bound to the function's signature, so equal
    calls hash equally however they are spelled."""
    path = task if isinstance(task, str) else task.module_path
    call = None if isinstance(task, str) else bound(task, args, kwargs)
    if unique.key is not None:
        parts: Any = ["key", unique.key]
    elif unique.by is None:
        parts = ["call", call] if call is not None else ["args", list(args), kwargs]
    else:
        parts = ["by", _pick(args, kwargs, call, unique.by, "unique by=", task)]
    until = None
    if unique.period is not None:
        window = math.floor(now.timestamp() / unique.period)
        parts = [*parts, window]
        until = datetime.fromtimestamp((window + 1) * unique.period, UTC)
    return hashlib.sha256(_text([path, parts]).encode()).hexdigest(), until


class KeyPlan:
    """A unique task's key, worked out once per task rather than per call: the JSON of the
    task path, the function's parameter names and their defaults (with a key given outright
    and no period, the whole hash). key() gives exactly what unique_key() gives; a call
    the plan does not cover (by=, a signature bound() cannot take apart) goes to it."""

    __slots__ = ("_constant", "_defaults", "_head", "_names", "_task", "hold_bits", "unique")

    def __init__(self, unique: Unique, task: Any) -> None:
        self.unique, self._task, self.hold_bits = unique, task, unique.hold_bits
        func = getattr(task, "func", None)
        plain = _plain(func, bool(getattr(task, "takes_context", False))) if func is not None else None
        fast = unique.key is None and unique.by is None and plain is not None
        self._names: tuple[str, ...] | None = plain[0] if fast and plain else None
        self._defaults = {k: _default(k, v) for k, v in plain[1].items()} if plain else {}
        # The text unique_key() hashes starts '["<path>",["call",' for a whole-call key.
        self._head = "[" + _text(task.module_path) + ',["call",'
        self._constant = None
        if unique.key is not None and unique.period is None:
            self._constant = unique_key(unique, task, (), {}, datetime.now(UTC))[0]

    def key(self, args: Sequence[Any], kwargs: dict[str, Any], now: datetime) -> tuple[str, datetime | None]:
        if self._constant is not None:
            return self._constant, None
        names = self._names
        values = None if names is None else self._bind(names, args, kwargs)
        if values is None:
            return unique_key(self.unique, self._task, args, kwargs, now)
        text = self._head + _text(values)
        until = None
        period = self.unique.period
        if period is not None:
            window = math.floor(now.timestamp() / period)
            text += f",{window}"
            until = datetime.fromtimestamp((window + 1) * period, UTC)
        return hashlib.sha256((text + "]]").encode()).hexdigest(), until

    def _bind(self, names: tuple[str, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """bound() for a plain signature, its defaults already made JSON-safe."""
        if not args and len(kwargs) == len(names):
            try:
                return {name: kwargs[name] for name in names}
            except KeyError:
                return None
        if len(args) > len(names):
            return None
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in values or name not in names:
                return None
            values[name] = value
        for name in names:
            if name not in values:
                if name not in self._defaults:
                    return None
                values[name] = self._defaults[name]
        return values


def limit_key(task: Any, by: tuple[str | int, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """A task's limit key from its arguments (@task(limit_by=...)): the values as compact
    JSON, so the dashboard shows which customer or account a task waits for."""
    values = _pick(args, kwargs, bound(task, args, kwargs), by, "limit_by=", task)
    text = _text(values[0] if len(values) == 1 else values)
    return text if len(text) <= 200 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def check_limit_key(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidTask(f"limit_key must be a string of 1 to 200 characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTask("limit_key must be valid text (it holds a lone surrogate)") from None
    return value


def as_by(value: Any, what: str) -> tuple[str | int, ...] | None:
    if value is None:
        return None
    by = (value,) if isinstance(value, (str, int)) else tuple(value) if isinstance(value, (list, tuple)) else None
    if not by or any(isinstance(n, bool) or not isinstance(n, (str, int)) for n in by):
        raise InvalidTask(f"{what} takes an argument name or position, or a list of them, got {value!r}")
    return by


class DuplicateTask(InvalidTask):
    """An enqueue refused because a task with the same unique key holds it (on_duplicate =
    "raise"); .existing is that task's result."""

    def __init__(self, existing: TaskResult) -> None:
        super().__init__(f"a task with the same unique key exists: {existing.id} ({existing.status})")
        self.existing = existing


@dataclass(frozen=True, slots=True, kw_only=True)
class ExistingTaskResult(OxTaskResult):
    """The result an enqueue returns for a duplicate: the existing task's, marked as such."""

    duplicate: bool = True


def as_existing(result: TaskResult) -> ExistingTaskResult:
    existing = ExistingTaskResult(**{f.name: getattr(result, f.name) for f in fields(result) if f.init})
    object.__setattr__(existing, "_return_value", result._return_value)
    return existing


def is_duplicate(result: TaskResult) -> bool:
    """Whether an enqueue answered with an existing task instead of a new one."""
    return isinstance(result, ExistingTaskResult)
