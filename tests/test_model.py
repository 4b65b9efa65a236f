"""Model-based test of the worker: Hypothesis drives random sequences of operations against
real `manage.py runworker` subprocesses and checks, after every step and at quiescence,
what the worker promises (README, "What the worker promises").

Steps: enqueue tasks of many kinds, one at a time or a burst through ox.enqueue_many
(tests/model_tasks.py: sync and async; short and long; succeeding, failing with retries,
giving up, raising odd exceptions, returning odd values, timing out), ox.cancel, ox.retry,
SIGKILL a worker, SIGTERM a worker (a replacement is started after either), let time pass;
on PostgreSQL also terminate a worker's backends and take the database away for a second
(every worker session terminated, again and again).

Invariants (each violation raises its own AssertionError subclass, named after the
invariant and the task kind, so Hypothesis reports and shrinks each distinct bug apart):

  I1  every task reaches a final state (SUCCESSFUL/FAILED/CANCELLED) within a bound
  I2  no task stays RUNNING without a live holder (its worker's process) longer than a
      rescue takes
  I3  Attempt rows match the counters: rows == attempts - (1 if RUNNING or SUCCESSFUL),
      numbered 1..rows; max_attempts == budget of the epoch + lost attempts since;
      finished_at set exactly when finished
  I4  a finished task never changes (a SUCCESSFUL result is never replaced) unless ox.retry
  I5  body runs (ledger): at most one per attempt number, none beyond `attempts`, a
      SUCCESSFUL task (or an attempt failed by the body's own exception) has the run of
      that attempt, every run ran in the process of the worker its attempt is recorded for
  I6  workers live unless the test killed them, exit 0 on SIGTERM, print no traceback
  C   an acknowledged cancel holds: a READY task stays CANCELLED; a RUNNING one finishes
      with the attempt that was running (or CANCELLED) and its body never runs again
  E   each kind ends as it must (see KINDS), e.g. an odd exception fails its task alone
      with its traceback stored; a return value JSON cannot keep fails without retry with
      an error that names the return value
  A   Django's get_result() reads every finished task

Each Hypothesis example starts from empty tables and stops its own workers (by pid).

Run (one database leg each; a few minutes):
    .venv/bin/python -m pytest tests/test_model.py -q -x
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oxproject .venv/bin/python -m pytest tests/test_model.py -q -x
Long mode, on demand:
    OX_MODEL_EXAMPLES=200 OX_MODEL_STEPS=50 .venv/bin/python -m pytest tests/test_model.py -q -x -s
Knobs (env): OX_MODEL_EXAMPLES (default 10), OX_MODEL_STEPS (default 10), OX_MODEL_SEED (an
integer, or "random": a fresh seed, printed; default: derandomized, the same sequences every
run), OX_MODEL_KINDS (comma-separated kind names to draw from, e.g. to chase one bug),
OX_MODEL_SHRINK=0 (report the first failing sequences unshrunk: faster), OX_MODEL_VERBOSE=1
(print every step as it runs), OX_MODEL_SPARE_BOOTING=1 (backend terminations spare workers
still starting up, to look past that failure). Worker logs stay in pytest's tmp_path (printed).
"""

import json
import os
import random
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.db import InterfaceError, OperationalError, connection, transaction
from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

import ox
from ox.models import FINISHED, Attempt, Status, Task, Tick, Worker
from tests import model_tasks as mt
from tests.conftest import WorkerProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = int(os.environ.get("OX_MODEL_EXAMPLES", "10"))
STEPS = int(os.environ.get("OX_MODEL_STEPS", "10"))
SEED_ENV = os.environ.get("OX_MODEL_SEED", "")
SHRINK = os.environ.get("OX_MODEL_SHRINK", "1") != "0"
VERBOSE = os.environ.get("OX_MODEL_VERBOSE", "") == "1"
SPARE_BOOTING = os.environ.get("OX_MODEL_SPARE_BOOTING", "") == "1"

LEASE = 3.0
HEARTBEAT = 0.5
RESCUE_INTERVAL = 0.3
SHUTDOWN_GRACE = 5.0
MAX_LOST = 5  # ox's default: a task lost this often is FAILED
WORKER_OPTIONS = {
    "LEASE": LEASE,
    "HEARTBEAT": HEARTBEAT,
    "RESCUE_INTERVAL": RESCUE_INTERVAL,
    "SHUTDOWN_GRACE": SHUTDOWN_GRACE,
    "MAX_LOST": MAX_LOST,
    # The model reads ox_task alone: a long run (OX_MODEL_STEPS) must not see finished tasks
    # moved to the archive 5 minutes on.
    "ARCHIVE_AFTER": None,
}
CONCURRENCY = 2
WORKER_ARGS = ["--concurrency", str(CONCURRENCY), "--interval", "0.2"]
# A dead worker's task is back within a lease plus a rescue interval (PostgreSQL: about a
# second); a replacement needs a few seconds to boot before it can rescue anything.
ORPHAN_BOUND = LEASE + 3 * RESCUE_INTERVAL + 8.0
QUIESCENCE_BASE = 15.0  # seconds, plus the queued work (see _quiesce)
STOP_BOUND = SHUTDOWN_GRACE + 10.0
ROW_FIELDS = ("status", "attempts", "worker_id", "cancel_requested")  # never return_value: it may not decode
DB_ERRORS = ("OperationalError", "InterfaceError", "AdminShutdown", "ConnectionTimeout")


# ---------------------------------------------------------------------------- task kinds
@dataclass(frozen=True, eq=False)
class Kind:
    """A kind of task the model enqueues, and what must become of it.

    expect: "ok" (SUCCESSFUL with `value`), "fails_twice" (SUCCESSFUL after at most two
    Boom failures), "fails" (FAILED after `budget` Boom failures), "gives_up" (FAILED after
    one failure: its backoff says no), "odd_exc" (FAILED after one failure of class `exc`,
    the traceback stored with `marker` in it), "ret_bad" (FAILED after one failure, no
    retry, an error naming the return value), "ret_either" (like ret_bad, or SUCCESSFUL
    with `value` exactly), "timeout" (FAILED after `budget` timed_out attempts).
    """

    name: str
    task: Any
    extra: tuple = ()
    expect: str = "ok"
    budget: int = 3
    seconds: float = 0.05  # one attempt, roughly
    value: Any = None  # the return value expected ("=key": the task's key)
    exc: str = ""
    marker: str = ""
    ordinary: bool = False  # a kind that should never be the cause of trouble

    def __repr__(self) -> str:
        return self.name

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis prints steps as enqueue(kind=ok_short)
        printer.text(self.name)


def _kinds() -> list[Kind]:
    k = [
        Kind("ok_short", mt.ok, (0.05,), value="=key", ordinary=True),
        Kind("aok_short", mt.aok, (0.05,), value="=key", ordinary=True),
        Kind("ok_long", mt.ok, (1.5,), seconds=1.5, value="=key", ordinary=True),
        Kind("aok_long", mt.aok, (1.5,), seconds=1.5, value="=key", ordinary=True),
        Kind("fails_twice", mt.fails_twice, expect="fails_twice", value="=key", ordinary=True),
        Kind("always_fails", mt.always_fails, expect="fails", budget=2, ordinary=True),
        Kind("aalways_fails", mt.aalways_fails, expect="fails", budget=2, ordinary=True),
        Kind("gives_up", mt.gives_up, expect="gives_up", ordinary=True),
        Kind("times_out", mt.times_out, expect="timeout", budget=2, seconds=0.6, ordinary=True),
        Kind("atimes_out", mt.atimes_out, expect="timeout", budget=2, seconds=0.6, ordinary=True),
    ]
    odd_exc = {
        "surrogate": ("tests.model_tasks.SurrogateError", "lone surrogate here"),
        "unprintable": ("tests.model_tasks.Unprintable", "Unprintable"),
        "system_exit": ("builtins.SystemExit", "SystemExit"),
        "keyboard_interrupt": ("builtins.KeyboardInterrupt", "KeyboardInterrupt"),
    }
    for which, (exc, marker) in odd_exc.items():
        k.append(Kind(f"exc_{which}", mt.raises_odd, (which,), expect="odd_exc", budget=1, exc=exc, marker=marker))
        k.append(Kind(f"aexc_{which}", mt.araises_odd, (which,), expect="odd_exc", budget=1, exc=exc, marker=marker))
    k.append(
        Kind(
            "aexc_cancelled_error",
            mt.araises_odd,
            ("cancelled_error",),
            expect="odd_exc",
            budget=1,
            exc="asyncio.exceptions.CancelledError",
            marker="CancelledError",
        )
    )
    returns = {
        "surrogate": ("ret_either", mt.SURROGATE),
        # Django's backends store normalize_json()'s JSON: int keys come back as strings.
        "int_keys": ("ret_either", {"1": "a"}),
        "tuple": ("ok", [1, "a"]),
        "set": ("ret_bad", None),
        "nan": ("ret_bad", None),
        # JSON could carry it, but Python's json refuses ints past 4300 digits by default
        # (int_max_str_digits): get_result() could never read it back.
        "bigint": ("ret_bad", None),
    }
    for which, (expect, value) in returns.items():
        k.append(Kind(f"ret_{which}", mt.returns_odd, (which,), expect=expect, value=value))
        k.append(Kind(f"aret_{which}", mt.areturns_odd, (which,), expect=expect, value=value))
    only = {n.strip() for n in os.environ.get("OX_MODEL_KINDS", "").split(",") if n.strip()}
    if only:
        unknown = only - {x.name for x in k}
        assert not unknown, f"OX_MODEL_KINDS: unknown kinds {sorted(unknown)}; known: {[x.name for x in k]}"
        k = [x for x in k if x.name in only]
    return k


KINDS = _kinds()


# ---------------------------------------------------------------------------- violations
_VIOLATIONS: dict[str, type[AssertionError]] = {}


def violation(name: str) -> type[AssertionError]:
    """One AssertionError subclass per invariant and kind: Hypothesis tells failures apart
    by exception type and raising line, so each distinct bug is shrunk and reported alone."""
    cls = _VIOLATIONS.get(name)
    if cls is None:
        cls = _VIOLATIONS[name] = type(name, (AssertionError,), {"__module__": __name__})
    return cls


@dataclass
class Problem:
    name: str  # e.g. "I3_attempt_rows[ok_short]"
    message: str


def raise_problems(problems: list[Problem]) -> None:
    """Raise the first problem's violation (it names the bug), with every problem's text."""
    if problems:
        raise violation(problems[0].name)("\n".join(f"{p.name}: {p.message}" for p in problems))


LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (\S+) ")
STDERR_NOISE = ("Exception in thread", "Exception ignored", "Fatal Python error", "--- Logging error ---")
# Django's own task_finished receiver logs every failed task with its exception: expected.
TRACEBACKS_EXPECTED_FROM = {"django.tasks"}
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def stray_tracebacks(output: str) -> list[str]:
    """Tracebacks a worker printed other than the one of Django's log record of a failed
    task: a crash, a dead thread, an error logged with exc_info, a log record that could not
    be written..."""
    found = []
    source = "<stdout>"
    record_had_traceback = False
    chain: str | None = None  # "expected" | "stray": the traceback chain being read
    previous = ""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if LOG_RECORD.match(line):
            source, record_had_traceback, chain = LOG_RECORD.match(line).group(1), False, None
        elif line.startswith(STDERR_NOISE):
            source, record_had_traceback, chain = "<stderr>", False, None
        elif line.startswith("Traceback"):
            if chain is not None and previous.startswith(CHAINED):
                pass  # the next part of the same chain
            elif source in TRACEBACKS_EXPECTED_FROM and not record_had_traceback:
                chain, record_had_traceback = "expected", True
            else:
                chain = "stray"
                end = next((j for j in range(i + 1, len(lines)) if LOG_RECORD.match(lines[j])), len(lines))
                found.append("\n".join(lines[max(0, i - 2) : end]))
        if line.strip():
            previous = line
    return found


def last_exception_name(output: str) -> str:
    """The class of the last exception a traceback in `output` ends with."""
    names = re.findall(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)):?", output, re.M)
    return names[-1].rsplit(".", 1)[-1] if names else "no traceback"


def pid_of(worker_id: str) -> int | None:
    parts = (worker_id or "").rsplit(":", 2)
    try:
        return int(parts[1]) if len(parts) == 3 else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------- model state
@dataclass
class Cancel:
    when: str  # "ready": READY -> CANCELLED at once; "running": cancel_requested set
    attempts: int  # the task's attempts when the cancel was acknowledged
    holder_pid: int | None  # running: the process of the attempt that was running


@dataclass
class Epoch:
    """A task's life from its enqueue (or an ox.retry) to the next ox.retry."""

    start: int  # attempts when it began
    budget: int
    cancel: Cancel | None = None
    end: tuple[str, int] | None = None  # (status, attempts) when an ox.retry ended it


@dataclass
class Tracked:
    key: str
    kind: Kind
    id: uuid.UUID
    order: int
    epochs: list[Epoch]


@dataclass
class AttemptRow:
    number: int
    outcome: str
    worker_id: str
    exception_class_path: str
    traceback: str


@dataclass
class Row:
    id: uuid.UUID
    status: str
    attempts: int
    max_attempts: int
    worker_id: str
    fence: int
    finished_at: Any
    return_raw: str | None
    attempt_rows: list[AttemptRow] = field(default_factory=list)

    def frozen(self) -> tuple:
        return (
            self.status,
            self.attempts,
            self.max_attempts,
            self.fence,
            str(self.finished_at),
            self.return_raw,
            len(self.attempt_rows),
        )


@dataclass
class Run:
    pid: int
    attempt: int


@dataclass
class Proc:
    worker: WorkerProcess
    app: str
    fate: str = "live"  # live | killed | terminated (the test's doing) | stopped (teardown)
    exit_code: int | None = None


def snapshot() -> dict[uuid.UUID, Row]:
    """Every task with its Attempt rows, read in one statement (one snapshot)."""
    rv = "t.return_value::text" if connection.vendor == "postgresql" else "t.return_value"
    sql = (
        f"SELECT t.id, t.status, t.attempts, t.max_attempts, t.worker_id, t.fence, t.finished_at, {rv},"
        " a.number, a.outcome, a.worker_id, a.exception_class_path, a.traceback"
        " FROM ox_task t LEFT JOIN ox_attempt a ON a.task_id = t.id ORDER BY t.id, a.number, a.id"
    )
    rows: dict[uuid.UUID, Row] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql)
        for r in cursor.fetchall():
            tid = uuid.UUID(str(r[0]))
            row = rows.get(tid)
            if row is None:
                row = rows[tid] = Row(tid, r[1], r[2], r[3], r[4], r[5], r[6], r[7])
            if r[8] is not None:
                row.attempt_rows.append(AttemptRow(r[8], r[9], r[10], r[11] or "", r[12] or ""))
    return rows


def ledger_runs() -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}
    for key, pid, attempt in Ledger.objects.values_list("key", "pid", "attempt"):
        runs.setdefault(key.split("#", 1)[0], []).append(Run(pid, attempt))
    return runs


def decode_return(raw: str | None) -> Any:
    if raw is None:
        return None
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.loads(raw)
    finally:
        sys.set_int_max_str_digits(old)


def same_value(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------- the machine
class WorkerModel(RuleBasedStateMachine):
    worker_env: ClassVar[dict[str, str]] = {}
    log_dir: ClassVar[Path] = Path(".")
    examples: ClassVar[int] = 0
    all_procs: ClassVar[list[WorkerProcess]] = []  # every worker this test started

    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.example = type(self).examples
        self.pg = connection.vendor == "postgresql"
        self.procs: list[Proc] = []
        self.tracked: dict[str, Tracked] = {}
        self.by_id: dict[uuid.UUID, Tracked] = {}
        self.settled: dict[str, tuple[int, tuple]] = {}  # key -> (epoch index, frozen row)
        self.orphaned_since: dict[uuid.UUID, float] = {}
        self.terminations = 0  # backend terminations / outages so far (DB errors become legal)
        self.problems: list[Problem] = []  # violations seen, in order (teardown raises them)
        self._stop_leftovers()
        self._clean_tables()

    # ------------------------------------------------------------------ helpers
    def _say(self, text: str) -> None:
        if VERBOSE:
            print(f"[model ex{self.example} {time.strftime('%H:%M:%S')}] {text}", flush=True)

    @classmethod
    def _stop_leftovers(cls) -> None:
        for w in cls.all_procs:
            w.stop()  # kills by pid if still running, waits, closes its log
        cls.all_procs.clear()

    @staticmethod
    def _clean_tables() -> None:
        Attempt.objects.all().delete()
        Task.objects.all().delete()
        Worker.objects.all().delete()
        Tick.objects.all().delete()
        Ledger.objects.all().delete()

    def _start_worker(self) -> Proc:
        n = len(self.procs)
        app = f"oxmodel-{os.getpid()}-{self.example}-{n}"
        env = {
            **self.worker_env,
            "OX_TEST_OPTIONS": json.dumps(WORKER_OPTIONS),
            "PGAPPNAME": app,  # libpq: every session of the process carries it
        }
        log = self.log_dir / f"example{self.example}-worker{n}.log"
        worker = WorkerProcess(list(WORKER_ARGS), env, log)
        type(self).all_procs.append(worker)
        proc = Proc(worker, app)
        self.procs.append(proc)
        self._say(f"started worker {n} pid={worker.pid}")
        return proc

    def _live(self) -> list[Proc]:
        return [p for p in self.procs if p.fate == "live"]

    def _pids_alive(self) -> dict[int, bool]:
        return {p.worker.pid: p.worker.proc.poll() is None for p in self.procs}

    def _enqueue(self, kind: Kind) -> str:
        key = f"t{len(self.tracked)}"
        result = kind.task.enqueue(key, *kind.extra)
        t = Tracked(key, kind, uuid.UUID(str(result.id)), len(self.tracked), [Epoch(0, kind.budget)])
        self.tracked[key] = t
        self.by_id[t.id] = t
        self._say(f"enqueued {key} {kind.name} {t.id}")
        return key

    def _wait_registered(self, proc: Proc, timeout: float = 20.0) -> bool:
        """Until the worker wrote its row (its signal handlers are installed by then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Worker.objects.filter(pid=proc.worker.pid).exists():
                return True
            if proc.worker.proc.poll() is not None:
                self._check_workers()
                return False
            time.sleep(0.05)
        self._record(
            [
                Problem(
                    "I6_worker_did_not_start",
                    f"worker pid={proc.worker.pid} wrote no ox_worker row within {timeout} s\n"
                    + proc.worker.output()[-3000:],
                )
            ]
        )
        return False

    def _apps(self, procs: list[Proc]) -> list[str]:
        """The application_names to cut: OX_MODEL_SPARE_BOOTING=1 spares workers that have not
        written their ox_worker row yet (to look past a worker dying while it starts)."""
        if SPARE_BOOTING:
            booted = set(Worker.objects.filter(pid__in=[p.worker.pid for p in procs]).values_list("pid", flat=True))
            procs = [p for p in procs if p.worker.pid in booted]
        return [p.app for p in procs]

    def _terminate_sessions(self, apps: list[str]) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ANY(%s)",
                [apps],
            )
            return cursor.fetchone()[0]

    # ------------------------------------------------------------------ rules
    # A violation is recorded, not raised: every later step still runs (doing nothing), so
    # the same choices always draw the same steps however the processes behave, and
    # teardown raises it. Once something is wrong the rest of the example is skipped.
    def _record(self, problems: list[Problem]) -> None:
        if problems and not self.problems:
            self._say(f"VIOLATION {problems[0].name}")
        self.problems.extend(problems)

    @initialize(
        target=tasks,
        workers=st.integers(1, 2),
        kinds=st.lists(st.sampled_from(KINDS), max_size=5),
    )
    def start(self, workers: int, kinds: list[Kind]):
        for _ in range(workers):
            self._start_worker()
        return multiple(*[self._enqueue(k) for k in kinds])

    @rule(target=tasks, kind=st.sampled_from(KINDS))
    def enqueue(self, kind: Kind) -> str:
        return self._enqueue(kind) if not self.problems else "skipped"

    @rule(target=tasks, kind=st.sampled_from([k for k in KINDS if k.seconds < 0.1] or KINDS), n=st.integers(2, 12))
    def enqueue_burst(self, kind: Kind, n: int):
        """Many short tasks in one ox.enqueue_many: claimed in batches, prefetched, handed back."""
        if self.problems:
            return multiple(*["skipped"] * n)  # as many as otherwise: the same choices, the same steps
        keys = [f"t{len(self.tracked) + i}" for i in range(n)]
        results = ox.enqueue_many(kind.task, [((key, *kind.extra), {}) for key in keys])
        for key, result in zip(keys, results, strict=True):
            t = Tracked(key, kind, uuid.UUID(str(result.id)), len(self.tracked), [Epoch(0, kind.budget)])
            self.tracked[key] = t
            self.by_id[t.id] = t
        self._say(f"enqueued {n} x {kind.name}: {keys[0]}..{keys[-1]}")
        return multiple(*keys)

    @rule(task=tasks)
    def cancel(self, task: str) -> None:
        if self.problems or task not in self.tracked:
            return
        t = self.tracked[task]
        with transaction.atomic():
            row = Task.objects.select_for_update().only(*ROW_FIELDS).get(pk=t.id)
            changed = ox.cancel(t.id)
        self._say(f"cancel {task} ({row.status}, attempts {row.attempts}): {changed}")
        if changed.cancelled != int(row.status == Status.READY) or changed.cancel_requested != int(
            row.status == Status.RUNNING and not row.cancel_requested
        ):
            self._record(
                [
                    Problem(
                        f"O_cancel_contract[{t.kind.name}]",
                        f"ox.cancel({task}) on a {row.status} task (cancel_requested={row.cancel_requested})"
                        f" returned {changed}",
                    )
                ]
            )
        epoch = t.epochs[-1]
        if epoch.cancel is None and changed.cancelled:
            epoch.cancel = Cancel("ready", row.attempts, None)
        elif epoch.cancel is None and changed.cancel_requested:
            epoch.cancel = Cancel("running", row.attempts, pid_of(row.worker_id))

    @rule(task=tasks)
    def retry(self, task: str) -> None:
        if self.problems or task not in self.tracked:
            return
        t = self.tracked[task]
        with transaction.atomic():
            row = Task.objects.select_for_update().only(*ROW_FIELDS).get(pk=t.id)
            changed = ox.retry(t.id)
        self._say(f"retry {task} ({row.status}, attempts {row.attempts}): {changed}")
        if changed.retried != int(row.status in (Status.FAILED, Status.CANCELLED)):
            self._record(
                [
                    Problem(
                        f"O_retry_contract[{t.kind.name}]",
                        f"ox.retry({task}) on a {row.status} task returned {changed}",
                    )
                ]
            )
        if changed.retried:
            t.epochs[-1].end = (row.status, row.attempts)
            t.epochs.append(Epoch(row.attempts, t.kind.budget))
            self.settled.pop(task, None)

    def _victim(self, which: int) -> Proc | None:
        live = self._live()
        if self.problems or not live:
            return None
        victim = live[which % len(live)]
        # Killing a worker still booting tests nothing; a SIGTERM before its handlers are in
        # place just kills it.
        return victim if self._wait_registered(victim) else None

    @rule(which=st.integers(0, 3))
    def sigkill(self, which: int) -> None:
        victim = self._victim(which)
        if victim is None:
            return
        victim.fate = "killed"
        victim.worker.signal(signal.SIGKILL)
        victim.exit_code = victim.worker.wait(timeout=10)
        self._say(f"SIGKILLed pid={victim.worker.pid}")
        self._start_worker()

    @rule(which=st.integers(0, 3))
    def sigterm(self, which: int) -> None:
        victim = self._victim(which)
        if victim is None:
            return
        victim.fate = "terminated"
        victim.worker.signal(signal.SIGTERM)
        self._start_worker()
        try:
            victim.exit_code = victim.worker.wait(timeout=STOP_BOUND)
        except Exception:
            victim.exit_code = None
        self._say(f"SIGTERMed pid={victim.worker.pid}: exit {victim.exit_code}")
        if victim.exit_code != 0:
            self._record([self._exit_problem(victim, f"did not exit 0 within {STOP_BOUND} s of a SIGTERM")])

    @precondition(lambda self: self.pg)
    @rule(which=st.one_of(st.none(), st.integers(0, 3)))
    def terminate_backends(self, which: int | None) -> None:
        """pg_terminate_backend of every session of one worker (None: of every worker)."""
        live = self._live()
        if self.problems or not live:
            return
        chosen = live if which is None else [live[which % len(live)]]
        self.terminations += 1
        n = self._terminate_sessions(self._apps(chosen))
        self._say(f"terminated {n} sessions of {[p.worker.pid for p in chosen]}")

    @precondition(lambda self: self.pg)
    @rule()
    def db_outage(self) -> None:
        """The database goes away for a second: every worker session terminated, again and
        again, as soon as it reconnects."""
        if self.problems:
            return
        self.terminations += 1
        end = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < end:
            n += self._terminate_sessions(self._apps(self._live()))
            time.sleep(0.05)
        self._say(f"outage: terminated {n} sessions")

    @rule(seconds=st.sampled_from([0.3, 1.0, 2.5]))
    def wait(self, seconds: float) -> None:
        if not self.problems:
            time.sleep(seconds)

    def _exit_problem(self, p: Proc, how: str) -> Problem:
        """I6: a worker process that ended badly. Named after the exception its output ends
        with (a crash), else its exit code: whether it died just before or just after a
        SIGTERM is timing, the same bug either way. Dying before it wrote its ox_worker row
        (its first connection cut, say) is told apart."""
        out = p.worker.output()
        stray = stray_tracebacks(out)
        cause = last_exception_name(stray[-1]) if stray else f"exit {p.exit_code}"
        booting = "" if Worker.objects.filter(pid=p.worker.pid).exists() else "_booting"
        return Problem(
            f"I6_worker_exit{booting}[{cause}]",
            f"worker pid={p.worker.pid} {how}, exit code {p.exit_code}:\n{out[-6000:]}",
        )

    # ------------------------------------------------------------------ invariants after every step
    def _check_workers(self) -> None:
        """I6: a worker that exits by itself is a failure (a replacement keeps the rest going)."""
        for p in list(self.procs):
            if p.fate == "live" and p.worker.proc.poll() is not None:
                p.fate = "died"
                p.exit_code = p.worker.proc.returncode
                self._record([self._exit_problem(p, "exited by itself")])
                self._start_worker()

    def _check_rows(self, rows: dict[uuid.UUID, Row]) -> list[Problem]:
        problems: list[Problem] = []
        now = time.monotonic()
        alive = self._pids_alive()
        for tid, row in rows.items():
            t = self.by_id.get(tid)
            if t is None:
                problems.append(Problem("I0_unknown_task", f"a task nobody enqueued: {row}"))
                continue
            name = t.kind.name
            # I3: the attempt rows and the counters agree.
            expected = row.attempts - (1 if row.status in (Status.RUNNING, Status.SUCCESSFUL) else 0)
            numbers = [a.number for a in row.attempt_rows]
            if len(numbers) != expected or sorted(numbers) != list(range(1, len(numbers) + 1)):
                problems.append(
                    Problem(
                        f"I3_attempt_rows[{name}]",
                        f"{t.key} is {row.status} with attempts={row.attempts} but has Attempt rows numbered"
                        f" {numbers} ({[a.outcome for a in row.attempt_rows]}); expected {expected} rows 1..{expected}",
                    )
                )
            epoch = t.epochs[-1]
            lost_since = sum(1 for a in row.attempt_rows if a.outcome == "lost" and a.number > epoch.start)
            if row.max_attempts != epoch.start + epoch.budget + lost_since:
                problems.append(
                    Problem(
                        f"I3_max_attempts[{name}]",
                        f"{t.key}: max_attempts={row.max_attempts}, expected {epoch.start} (attempts at the last"
                        f" enqueue/retry) + {epoch.budget} (budget) + {lost_since} (lost attempts since)",
                    )
                )
            if (row.status in FINISHED) != (row.finished_at is not None):
                problems.append(
                    Problem(f"I3_finished_at[{name}]", f"{t.key} is {row.status} with finished_at={row.finished_at}")
                )
            # I4: a finished task stays as it finished, until ox.retry.
            if row.status in FINISHED:
                frozen = row.frozen()
                seen = self.settled.get(t.key)
                if seen is None or seen[0] != len(t.epochs):
                    self.settled[t.key] = (len(t.epochs), frozen)
                elif seen[1] != frozen:
                    problems.append(
                        Problem(
                            f"I4_finished_changed[{name}]",
                            f"{t.key} finished as (status, attempts, max_attempts, fence, finished_at, return,"
                            f" attempt rows) = {seen[1]} and later read {frozen} (no ox.retry in between)",
                        )
                    )
            elif t.key in self.settled and self.settled[t.key][0] == len(t.epochs):
                problems.append(
                    Problem(
                        f"I4_finished_changed[{name}]",
                        f"{t.key} finished as {self.settled[t.key][1]} and is now {row.status} without an ox.retry",
                    )
                )
            # I2: RUNNING only under a live holder (a dead one's tasks are rescued in time).
            if row.status == Status.RUNNING:
                pid = pid_of(row.worker_id)
                if pid not in alive:
                    problems.append(
                        Problem(
                            f"I2_foreign_holder[{name}]", f"{t.key} RUNNING under {row.worker_id!r}, no worker of ours"
                        )
                    )
                elif not alive[pid]:
                    since = self.orphaned_since.setdefault(tid, now)
                    if now - since > ORPHAN_BOUND:
                        problems.append(
                            Problem(
                                f"I2_orphan[{name}]",
                                f"{t.key} RUNNING under dead worker {row.worker_id} for {now - since:.1f} s"
                                f" (bound {ORPHAN_BOUND} s)",
                            )
                        )
                else:
                    self.orphaned_since.pop(tid, None)
            else:
                self.orphaned_since.pop(tid, None)
        return problems

    @invariant()
    def system_is_sound(self) -> None:
        if not self.problems:
            self._check_workers()
            self._record(self._check_rows(snapshot()))

    # ------------------------------------------------------------------ at quiescence
    def _quiesce(self) -> None:
        """I1: wait (bounded) until every task is final, checking the rest meanwhile."""
        rows = snapshot()
        pending = [self.by_id[r.id].kind for r in rows.values() if r.status not in FINISHED and r.id in self.by_id]
        work = sum(k.seconds * (k.budget + 1) for k in pending)
        bound = min(QUIESCENCE_BASE + work / CONCURRENCY, 120.0)
        deadline = time.monotonic() + bound
        while not self.problems:
            self._check_workers()
            rows = snapshot()
            self._record(self._check_rows(rows))
            if all(r.status in FINISHED for r in rows.values()):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if self.problems:
            return
        stuck = sorted(
            (self.by_id[r.id] for r in rows.values() if r.status not in FINISHED),
            key=lambda t: (t.kind.ordinary, rows[t.id].status != Status.RUNNING, t.order),
        )
        alive = self._pids_alive()
        lines = []
        for t in stuck:
            r = rows[t.id]
            holder = f" held by {r.worker_id} ({'live' if alive.get(pid_of(r.worker_id)) else 'dead'})"
            lines.append(f"{t.key} {t.kind.name}: {r.status} attempts={r.attempts}/{r.max_attempts}{holder}")
        logs = "\n".join(f"--- worker {p.worker.pid} ({p.fate}):\n{p.worker.output()[-2500:]}" for p in self._live())
        self._record(
            [
                Problem(
                    f"I1_not_final[{stuck[0].kind.name}]",
                    f"{len(stuck)} task(s) not final {bound:.0f} s after the last step:\n"
                    + "\n".join(lines)
                    + "\n"
                    + logs,
                )
            ]
        )

    def _epoch_problems(self, t: Tracked, row: Row, runs: list[Run]) -> list[Problem]:
        problems: list[Problem] = []
        name = t.kind.name
        for i, epoch in enumerate(t.epochs):
            status, end_attempts = epoch.end or (row.status, row.attempts)
            rows_e = [a for a in row.attempt_rows if epoch.start < a.number <= end_attempts]
            runs_e = [r for r in runs if epoch.start < r.attempt <= end_attempts]
            label = f"{t.key} (epoch {i}: attempts {epoch.start}..{end_attempts}, ended {status})"
            final = epoch.end is None
            value = decode_return(row.return_raw) if final and status == Status.SUCCESSFUL else None
            c = epoch.cancel
            if c is not None:
                later_runs = [r for r in runs_e if r.attempt > c.attempts]
                if c.when == "ready":
                    if status != Status.CANCELLED or end_attempts != c.attempts or later_runs:
                        problems.append(
                            Problem(
                                f"C_ready_cancel_lost[{name}]",
                                f"{label}: cancelled while READY at attempts={c.attempts}, yet ended {status} with"
                                f" attempts={end_attempts}, runs after the cancel: {later_runs}",
                            )
                        )
                    continue
                same_attempt_elsewhere = [r for r in runs_e if r.attempt == c.attempts and r.pid != c.holder_pid]
                if later_runs or same_attempt_elsewhere or (end_attempts > c.attempts and status != Status.CANCELLED):
                    problems.append(
                        Problem(
                            f"C_running_cancel_lost[{name}]",
                            f"{label}: cancel requested while attempt {c.attempts} ran (pid {c.holder_pid}); the"
                            f" body ran again after it: {later_runs + same_attempt_elsewhere}; ended {status} with"
                            f" attempts={end_attempts}; attempts: {[(a.number, a.outcome) for a in rows_e]}",
                        )
                    )
                if status == Status.SUCCESSFUL and t.kind.expect in ("ok", "fails_twice", "ret_either"):
                    expected = t.key if t.kind.value == "=key" else t.kind.value
                    if not same_value(value, expected):
                        problems.append(
                            Problem(f"E_return_value[{name}]", f"{label}: returned {value!r}, expected {expected!r}")
                        )
                continue
            problems.extend(self._kind_problems(t, row, label, status, rows_e, value))
        return problems

    def _kind_problems(
        self, t: Tracked, row: Row, label: str, status: str, rows_e: list[AttemptRow], value: Any
    ) -> list[Problem]:
        kind = t.kind
        fails = [a for a in rows_e if a.outcome in ("failed", "timed_out", "cancelled")]

        def db_error(a: AttemptRow) -> bool:
            return self.terminations > 0 and a.exception_class_path.rsplit(".", 1)[-1] in DB_ERRORS

        own = [a for a in fails if not db_error(a)]
        last = max(rows_e, key=lambda a: a.number) if rows_e else None
        lost_total = sum(1 for a in row.attempt_rows if a.outcome == "lost")
        gave_up = status == Status.FAILED and last is not None and last.outcome == "lost" and lost_total >= MAX_LOST
        if gave_up:
            return []
        summary = [(a.number, a.outcome, a.exception_class_path) for a in rows_e]
        expected_value = t.key if kind.value == "=key" else kind.value
        budget = kind.budget

        def wrong(why: str) -> list[Problem]:
            return [Problem(f"E_outcome[{kind.name}]", f"{label}: {why}; attempts: {summary}")]

        db_exhausted = status == Status.FAILED and len(fails) == budget and len(own) < len(fails)
        if kind.expect == "ok":
            if status == Status.SUCCESSFUL:
                if own:
                    return wrong(f"SUCCESSFUL, but after failures of its own: {[a.exception_class_path for a in own]}")
                if not same_value(value, expected_value):
                    return wrong(f"returned {value!r}, expected {expected_value!r}")
                return []
            return [] if db_exhausted and not own else wrong(f"ended {status}, expected SUCCESSFUL")
        if kind.expect == "fails_twice":
            if status == Status.SUCCESSFUL:
                if len(own) > 2 or any(a.exception_class_path != "tests.model_tasks.Boom" for a in own):
                    return wrong("SUCCESSFUL after failures other than its two Boom runs")
                if not same_value(value, expected_value):
                    return wrong(f"returned {value!r}, expected {expected_value!r}")
                return []
            return [] if db_exhausted else wrong(f"ended {status}, expected SUCCESSFUL")
        if kind.expect in ("fails", "timeout"):
            outcome = "failed" if kind.expect == "fails" else "timed_out"
            if status != Status.FAILED or len(fails) != budget or any(a.outcome != outcome for a in own):
                return wrong(f"ended {status}, expected FAILED after {budget} {outcome} attempts")
            if kind.expect == "fails" and any(a.exception_class_path != "tests.model_tasks.Boom" for a in own):
                return wrong("failed with something other than its Boom")
            return []
        if kind.expect == "gives_up":
            if status != Status.FAILED or len(fails) != 1:
                return wrong(f"ended {status} after {len(fails)} failures; its backoff allows no retry")
            return []
        if kind.expect == "odd_exc":
            if status != Status.FAILED or len(fails) != 1 or fails[0].outcome != "failed":
                return wrong(f"ended {status}, expected FAILED after one failed attempt")
            a = fails[0]
            if db_error(a):
                return []
            if a.exception_class_path != kind.exc or kind.marker not in a.traceback:
                return wrong(
                    f"stored exception {a.exception_class_path!r} (expected {kind.exc!r}) with traceback"
                    f" {a.traceback[-300:]!r} (expected to contain {kind.marker!r})"
                )
            return []
        if kind.expect in ("ret_bad", "ret_either"):
            if kind.expect == "ret_either" and status == Status.SUCCESSFUL:
                if own:
                    return wrong(f"SUCCESSFUL after failures of its own: {[a.exception_class_path for a in own]}")
                if not same_value(value, expected_value):
                    return wrong(f"returned {value!r}, expected {expected_value!r} exactly")
                return []
            if status != Status.FAILED or len(own) != 1 or own[0].outcome != "failed":
                return wrong(
                    f"ended {status} after {len(own)} failures of its own; expected FAILED after one attempt (a return"
                    " value JSON cannot keep is not retried)"
                )
            if "return value" not in own[0].traceback.lower():
                return wrong(f"the stored error does not name the return value: {own[0].traceback[-400:]!r}")
            return []
        raise AssertionError(kind.expect)

    def _final_problems(self, rows: dict[uuid.UUID, Row]) -> list[Problem]:
        problems: list[Problem] = []
        runs_by_key = ledger_runs()
        for t in sorted(self.tracked.values(), key=lambda t: t.order):
            row = rows.get(t.id)
            name = t.kind.name
            if row is None:
                problems.append(Problem(f"I0_task_vanished[{name}]", f"{t.key} has no row"))
                continue
            runs = runs_by_key.get(t.key, [])
            # I5: body runs against attempts.
            per_attempt: dict[int, list[Run]] = {}
            for r in runs:
                per_attempt.setdefault(r.attempt, []).append(r)
            dups = {n: rs for n, rs in per_attempt.items() if len(rs) > 1}
            if dups:
                problems.append(
                    Problem(
                        f"I5_duplicate_run[{name}]", f"{t.key}: the body ran more than once for one attempt: {dups}"
                    )
                )
            out_of_range = [r for r in runs if not 1 <= r.attempt <= row.attempts]
            if out_of_range or len(runs) > row.attempts:
                problems.append(
                    Problem(
                        f"I5_runs_beyond_attempts[{name}]",
                        f"{t.key}: {len(runs)} body runs (attempt, pid) {[(r.attempt, r.pid) for r in runs]}"
                        f" for attempts={row.attempts}",
                    )
                )
            recorded = {a.number: a for a in row.attempt_rows}
            if row.status == Status.SUCCESSFUL:
                final_runs = per_attempt.get(row.attempts, [])
                if not any(r.pid == pid_of(row.worker_id) for r in final_runs):
                    problems.append(
                        Problem(
                            f"I5_success_without_run[{name}]",
                            f"{t.key}: SUCCESSFUL on attempt {row.attempts} by {row.worker_id}, but that attempt's"
                            f" body runs are {[(r.attempt, r.pid) for r in final_runs]}",
                        )
                    )
            for r in runs:
                a = recorded.get(r.attempt)
                holder = a.worker_id if a is not None else row.worker_id if r.attempt == row.attempts else None
                if holder is not None and pid_of(holder) != r.pid:
                    problems.append(
                        Problem(
                            f"I5_run_in_wrong_process[{name}]",
                            f"{t.key}: attempt {r.attempt} ran in pid {r.pid} but is recorded for worker {holder}",
                        )
                    )
            # An attempt that failed with the body's own exception ran the body, in its worker.
            own_classes = {"tests.model_tasks.Boom", t.kind.exc} - {""}
            for a in row.attempt_rows:
                if a.outcome == "failed" and a.exception_class_path in own_classes:
                    if not any(r.pid == pid_of(a.worker_id) for r in per_attempt.get(a.number, [])):
                        problems.append(
                            Problem(
                                f"I5_failure_without_run[{name}]",
                                f"{t.key}: attempt {a.number} failed with {a.exception_class_path} in"
                                f" {a.worker_id}, but that attempt's body runs are {per_attempt.get(a.number, [])}",
                            )
                        )
            # C and E: what became of the task, epoch by epoch.
            problems.extend(self._epoch_problems(t, row, runs))
            # A: Django's API reads it.
            try:
                result = t.kind.task.get_result(str(t.id))
                expected = "SUCCESSFUL" if row.status == Status.SUCCESSFUL else "FAILED"
                if str(result.status) != expected and getattr(result.status, "value", None) != expected:
                    problems.append(
                        Problem(
                            f"A_get_result[{name}]", f"{t.key}: get_result().status={result.status}, row {row.status}"
                        )
                    )
            except Exception as exc:
                problems.append(Problem(f"A_get_result[{name}]", f"{t.key}: get_result() raised {exc!r}"))
        return problems

    def _stop_workers(self) -> list[Problem]:
        problems = []
        live = self._live()
        for p in live:
            self._wait_registered(p)  # a SIGTERM before the handlers are in place just kills
        for p in live:
            p.worker.signal(signal.SIGTERM)
            p.fate = "stopped"
        for p in live:
            try:
                p.exit_code = p.worker.wait(timeout=STOP_BOUND)
            except Exception:
                p.exit_code = None
            if p.exit_code != 0:
                problems.append(self._exit_problem(p, f"did not exit 0 within {STOP_BOUND} s of the final SIGTERM"))
        for p in self.procs:
            stray = stray_tracebacks(p.worker.output())
            if stray:
                problems.append(
                    Problem(
                        f"I6_traceback_in_output[{last_exception_name(stray[0])}]",
                        f"worker pid={p.worker.pid} ({p.fate}) printed {len(stray)} traceback(s); the first:\n"
                        + stray[0][:5000],
                    )
                )
        return problems

    def teardown(self) -> None:
        try:
            if not self.problems:
                self._quiesce()
            if not self.problems:
                self._record(self._final_problems(snapshot()))
                self._record(self._stop_workers())
        finally:
            for p in self.procs:
                p.worker.stop()
            type(self).all_procs.clear()
            self._clean_tables()
        raise_problems(self.problems)


# ---------------------------------------------------------------------------- the test
def _seed() -> int | None:
    if not SEED_ENV:
        return None
    return random.randrange(2**32) if SEED_ENV == "random" else int(SEED_ENV)


@pytest.mark.timeout(900 + EXAMPLES * 120)
def test_worker_model(worker_env, tmp_path):
    WorkerModel.worker_env = worker_env
    WorkerModel.log_dir = tmp_path
    WorkerModel.examples = 0
    chosen = _seed()
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if SHRINK else [])
    config = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=chosen is None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        verbosity=Verbosity.verbose if VERBOSE else Verbosity.normal,
    )
    print(
        f"\nworker model on {connection.vendor}: {EXAMPLES} examples x {STEPS} steps,"
        f" {'derandomized' if chosen is None else f'OX_MODEL_SEED={chosen}'}, kinds {[k.name for k in KINDS]},"
        f" worker logs in {tmp_path}",
        flush=True,
    )
    test = get_state_machine_test(WorkerModel, settings=config)
    if chosen is not None:
        test = seed(chosen)(test)
    server_started = postgres_started_at()
    try:
        test()
    except BaseException as exc:
        if server_started != postgres_started_at():
            # Someone restarted the server under us (another test session's restart test):
            # every worker saw an outage the model did not make. Nothing here can be trusted.
            pytest.skip(f"PostgreSQL restarted during the model run; results void ({type(exc).__name__})")
        raise
    finally:
        WorkerModel._stop_leftovers()


def postgres_started_at() -> Any:
    if connection.vendor != "postgresql":
        return None
    for _ in range(30):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_postmaster_start_time()")
                return cursor.fetchone()[0]
        except (OperationalError, InterfaceError):
            connection.close()
            time.sleep(1.0)
    return "unreachable"
