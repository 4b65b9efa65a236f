"""Durable steps: inside a task, `ox.step("name", fn, *args)` runs `fn` once per task, however
many attempts the task takes. The first time a step returns, its result is recorded (JSON, in
ox_step, written only while the attempt still holds the task: fenced); a later attempt (a
retry after a failure, a rescue after the worker died, a retry from the dashboard) gets the
recorded result back instead of running the step again. So a task of five steps that fails at
the fifth runs only the fifth again.

A step is run at least once and recorded at most once: a worker that dies after a step's
work but before its record runs that step again on the next attempt. Names are unique within
a task: a step name used twice in one attempt is a mistake in the task, and an error."""

import contextvars
import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections

from ox import clock
from ox.db import driver
from ox.jsoncheck import _text_problem
from ox.metadata import MAX_DEPTH, in_pool_thread, nesting_over
from ox.storable import NotStorable, return_json

MAX_NAME = 200  # ox_step.name


class StepError(RuntimeError):
    """A step used outside a task run by an ox worker, or a name used twice in one attempt."""


class LeaseLost(RuntimeError):
    """The attempt no longer holds its task (its lease was taken, or it was cancelled and
    finished): its step's result was not recorded, and this attempt stops here."""


@dataclass(slots=True)
class Scope:
    """The attempt whose steps are being run."""

    claim: uuid.UUID
    fence: int
    attempt: int
    using: str
    recorded: dict[str, Any] | None = None  # name -> result, read at the first step
    used: set[str] = field(default_factory=set)


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("ox_step_scope", default=None)


def enter(claim: uuid.UUID, fence: int, attempt: int, using: str) -> contextvars.Token:
    return _scope.set(Scope(claim, fence, attempt, using))


def leave(token: contextvars.Token) -> None:
    _scope.reset(token)


def _current(name: str) -> Scope:
    scope = _scope.get()
    if scope is None:
        raise StepError(f"ox.step({name!r}) runs only inside a task run by an ox worker")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise StepError(f"a step name is a non-empty string of at most {MAX_NAME} characters, got {name!r}")
    problem = _text_problem(name)
    if problem:  # refused before the step runs: its record could never be written
        raise StepError(f"the step name {name!r} {problem}")
    if name in scope.used:
        raise StepError(f"step {name!r} was already used in this attempt: step names are unique within a task")
    scope.used.add(name)
    return scope


def _recorded(scope: Scope) -> dict[str, Any]:
    if scope.recorded is None:
        conn = connections[scope.using]
        rows = driver(conn).recorded_steps(conn, scope.claim)
        scope.recorded = {name: _decode(result) for name, result in rows}
    return scope.recorded


def _decode(stored: Any) -> Any:
    return json.loads(stored) if isinstance(stored, (str, bytes)) else stored


def _storable(value: Any) -> tuple[str, Any]:
    """The JSON text of a step's result and the value it gives back, or NotStorable."""
    text = return_json(value)
    value = json.loads(text)
    if nesting_over(value, MAX_DEPTH):  # MariaDB's JSON_VALID refuses it: every database alike
        raise NotStorable(f"the step's result nests objects and arrays deeper than {MAX_DEPTH} levels")
    return text, value


def _record(scope: Scope, name: str, text: str, started: datetime) -> None:
    conn = connections[scope.using]
    finished = clock.estimated_now()
    try:
        written = driver(conn).record_step(conn, scope.claim, scope.fence, name, text, scope.attempt, started, finished)
    except IntegrityError:
        written = False  # recorded already: by this task's attempt that held it before us
    if not written:
        raise LeaseLost(f"step {name!r} ran, but task {scope.claim} is no longer held by this attempt: not recorded")


def step(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The result of `fn(*args, **kwargs)`, run and recorded the first time this task reaches
    step `name`, read back from the record at every later attempt. The result must be JSON
    (what comes back is what JSON gives: a tuple comes back a list, the first time too)."""
    scope = _current(name)
    recorded = _recorded(scope)
    if name in recorded:
        return recorded[name]
    started = clock.estimated_now()
    text, value = _storable(fn(*args, **kwargs))
    _record(scope, name, text, started)
    recorded[name] = value
    return value


async def astep(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """step() for async tasks: `fn` may be a coroutine function (awaited) or a plain one."""
    scope = _current(name)
    recorded = await in_pool_thread(scope.using, _recorded, scope)
    if name in recorded:
        return recorded[name]
    started = clock.estimated_now()
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    text, value = _storable(value)
    await in_pool_thread(scope.using, _record, scope, name, text, started)
    recorded[name] = value
    return value
