"""Task metadata, in the shape of Django's proposal (django/new-features #141): a JSON object
beside a task's arguments, given at enqueue (`task.using(metadata={...})`), read and changed
by the running task (`context.metadata`), saved by it (`context.save_metadata()` /
`asave_metadata()`) and at its end, and read back with the result (`result.metadata`).

Every write names the attempt (id and fence) and a RUNNING row: an attempt whose lease was
taken writes nothing. A task may save often (a progress bar at 10/s): one attempt's metadata is
written at most once per MIN_INTERVAL from its own thread; a save inside that interval is kept
as pending and written by the worker's next heartbeat, or by the next save past the interval,
or at the end of the attempt, whichever comes first."""

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.tasks import TaskContext, TaskResult
from django.tasks.base import TASK_REFRESH_ATTRS

from ox.db import driver
from ox.jsoncheck import json_problem

logger = logging.getLogger("ox.worker")

MIN_INTERVAL = 1.0  # seconds between two writes of one attempt's metadata from its thread
MAX_BYTES = 64 * 1024  # of the JSON text: metadata is a note about a task, not its payload
# Levels of nested objects and arrays, the outermost one included: MariaDB's JSON_VALID (the
# CHECK of its JSON columns) refuses deeper documents, so every database refuses them alike.
MAX_DEPTH = 31


class InvalidMetadata(ValueError):
    """Metadata that is not a JSON object with string keys ox can store unchanged."""


def nesting_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests objects and arrays deeper than `limit` levels. A walk with a
    stack of its own (no recursion), that stops past the limit (a dict holding itself too)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def metadata_text(value: Any, what: str = "metadata") -> str:
    """The JSON text of `value`, or InvalidMetadata saying what is wrong with it."""
    if not isinstance(value, dict):
        raise InvalidMetadata(f"{what} must be a dict (a JSON object), got {type(value).__name__}")
    if nesting_over(value):
        # Checked first: the walks below recurse, and MariaDB's CHECK would refuse it anyway.
        raise InvalidMetadata(f"{what} nests objects and arrays deeper than {MAX_DEPTH} levels")
    problem = json_problem(value, what)
    if problem is not None:
        raise InvalidMetadata(problem)
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    if len(text.encode()) > MAX_BYTES:
        raise InvalidMetadata(f"{what} is {len(text.encode())} bytes as JSON; at most {MAX_BYTES}")
    return text


def checked(value: Any) -> dict[str, Any]:
    """Metadata given at enqueue, as it will come back (a copy through JSON)."""
    return json.loads(metadata_text(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class OxTaskResult(TaskResult):
    """Django's TaskResult with the task's metadata (the proposal's `TaskResult.metadata`)."""

    metadata: dict[str, Any] = field(default_factory=dict)

    def refresh(self) -> None:
        fresh = self.task.get_backend().get_result(self.id)
        for name in (*TASK_REFRESH_ATTRS, "metadata"):
            object.__setattr__(self, name, getattr(fresh, name))

    async def arefresh(self) -> None:
        await sync_to_async(self.refresh, thread_sensitive=True)()


class Saved:
    """One attempt's metadata writes: what was last written, what waits, and when."""

    __slots__ = ("claim", "fence", "lock", "lost", "pending", "started", "using", "wrote_at", "written")

    def __init__(self, claim: uuid.UUID, fence: int, using: str, written: str, started: datetime | None) -> None:
        self.claim, self.fence, self.using, self.started = claim, fence, using, started
        self.lock = threading.Lock()  # the task's thread and the heartbeat both write
        self.written = written  # the JSON text the row holds (as far as this attempt knows)
        self.pending: str | None = None  # saved inside MIN_INTERVAL, not written yet
        self.wrote_at = float("-inf")
        self.lost = False  # a write found the row no longer this attempt's: for good (fences only grow)

    def write(self, conn: BaseDatabaseWrapper, text: str) -> bool:
        """Write `text` if it is new; False when the attempt no longer holds the row. Called
        with `lock` held."""
        if self.lost:
            self.pending = None
            return False
        if text == self.written:
            self.pending = None
            return True
        held = driver(conn).save_metadata(conn, self.claim, self.fence, text, self.started)
        self.pending, self.wrote_at = None, time.monotonic()
        if held:
            self.written = text
        else:
            self.lost = True  # the row holds what it held: what this attempt saved is not there
        return held


# Attempts of this process with a save waiting for the heartbeat.
_waiting: dict[tuple[uuid.UUID, int], Saved] = {}
_waiting_lock = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class OxTaskContext(TaskContext):
    """Django's TaskContext with the proposal's metadata API."""

    saved: Saved = field(repr=False, compare=False)

    @property
    def metadata(self) -> dict[str, Any]:
        return self.task_result.metadata  # type: ignore[attr-defined]  (an OxTaskResult)

    def save_metadata(self) -> bool:
        """Save `metadata` now, or, within MIN_INTERVAL of the last write, at the worker's
        next heartbeat (or this attempt's next save or end). False: this attempt no longer
        holds the task (its lease was taken), so nothing was written."""
        text = metadata_text(self.metadata, "context.metadata")
        saved = self.saved
        with saved.lock:
            held = _hold(saved, text)
            return saved.write(connections[saved.using], text) if held is None else held

    async def asave_metadata(self) -> bool:
        # Most saves of a task that saves often only wait for the interval: decided here, on
        # the event loop, without a trip to a thread (bench cell progress_metadata: half the
        # CPU per task). A save that writes, or finds the lock taken (the heartbeat writing
        # this attempt's), goes to a thread.
        text = metadata_text(self.metadata, "context.metadata")
        saved = self.saved
        if saved.lock.acquire(blocking=False):
            try:
                held = _hold(saved, text)
            finally:
                saved.lock.release()
            if held is not None:
                return held
        return await in_pool_thread(saved.using, self.save_metadata)


def _hold(saved: Saved, text: str) -> bool | None:
    """A save that needs no write now: its answer (False: the attempt lost the task; True:
    nothing new, or kept for later). None: write it now. Called with `saved.lock` held."""
    if saved.lost:
        return False
    if text == saved.written:
        saved.pending = None
        return True
    if time.monotonic() - saved.wrote_at < MIN_INTERVAL:
        saved.pending = text
        with _waiting_lock:
            _waiting[(saved.claim, saved.fence)] = saved
        return True
    return None


def with_fresh_connection[T](using: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with Django's per-request connection handling around it."""
    conn = connections[using]
    conn.close_if_unusable_or_obsolete()
    try:
        return fn(*args)
    finally:
        conn.close_if_unusable_or_obsolete()


async def in_pool_thread[T](using: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread of the event loop's executor, with Django's per-request
    connection handling around it (as a sync task's thread has around each task): these
    threads live as long as the worker, and a connection each kept them for good, which
    failed every later call once the server had ended its session (a restart, an idle
    timeout). With CONN_MAX_AGE 0 (Django's default) each call has a connection of its own."""
    return await sync_to_async(with_fresh_connection, thread_sensitive=False)(using, fn, *args)


def context_for(result: OxTaskResult, claim: uuid.UUID, fence: int, using: str) -> OxTaskContext:
    """The context of one attempt, whose result holds the metadata as claimed."""
    try:
        written = metadata_text(result.metadata)
    except InvalidMetadata:
        written = ""  # stored before a rule of today's: anything the task saves is new
    saved = Saved(claim, fence, using, written, result.last_attempted_at)
    return OxTaskContext(task_result=result, saved=saved)


def at_end(context: OxTaskContext | None) -> None:
    """The attempt is over: what its metadata holds now is written (the proposal: saved when
    the task finishes, however it finishes). A failure here is logged; the outcome stands."""
    if context is None:
        return
    saved = context.saved
    with _waiting_lock:
        _waiting.pop((saved.claim, saved.fence), None)
    try:
        text = metadata_text(context.metadata, "context.metadata")
    except Exception as exc:  # noqa: BLE001  (InvalidMetadata; a dict another thread changes meanwhile)
        text = saved.pending
        logger.warning("ox: task %s: its metadata was not saved at its end: %r", saved.claim, exc)
        if text is None:
            return
    try:
        with saved.lock:
            saved.write(connections[saved.using], text)
    except Exception:  # noqa: BLE001  (the outcome stands whatever this raises)
        logger.exception("ox: task %s: its metadata could not be saved at its end", saved.claim)


class Busy:
    """end_text(wait=False) found the heartbeat writing this attempt's metadata."""


BUSY = Busy()


def end_text(context: OxTaskContext, wait: bool = True) -> str | None | Busy:
    """A successful attempt is over: the JSON text its completion writes with it (None:
    nothing new since the last write, or the attempt lost the task). The save waiting for the
    heartbeat is dropped: the completion carries what the task holds now. Metadata the task
    cannot store (changed after its last save, say to NaN) keeps its last good save, as
    at_end does. wait=False (an event loop, which must not wait out the heartbeat's write, a
    round trip or a row lock): BUSY if the heartbeat holds the attempt's lock; ask again from
    a thread."""
    saved = context.saved
    if not saved.lock.acquire(blocking=wait):
        return BUSY
    try:
        with _waiting_lock:
            _waiting.pop((saved.claim, saved.fence), None)
        try:
            text: str | None = metadata_text(context.metadata, "context.metadata")
        except Exception as exc:  # noqa: BLE001  (InvalidMetadata; a dict another thread changes meanwhile)
            text = saved.pending
            logger.warning("ox: task %s: its metadata was not saved at its end: %r", saved.claim, exc)
        saved.pending = None
        if saved.lost or text is None or text == saved.written:
            return None
        return text
    finally:
        saved.lock.release()


def flush_waiting(conn: BaseDatabaseWrapper) -> int:
    """The heartbeat's part: write every save still waiting, on the worker's connection.
    Returns how many were written."""
    with _waiting_lock:
        waiting = list(_waiting.values())
        _waiting.clear()
    written = 0
    for i, saved in enumerate(waiting):
        with saved.lock:
            if saved.pending is None:
                continue
            try:
                saved.write(conn, saved.pending)
            except DatabaseError:
                with _waiting_lock:  # the next heartbeat tries again (after the reconnect)
                    for rest in waiting[i:]:
                        _waiting.setdefault((rest.claim, rest.fence), rest)
                raise
            written += 1
    return written
