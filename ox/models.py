"""The queue's tables. Status changes go through ox.sql (hot paths) and ox.operations."""

from django.db import models
from django.db.models import F, Q
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

from ox.db.indexes import PartialIndex, PartialUnique
from ox.ids import uuid7


class Status(models.TextChoices):
    # PENDING: a workflow's task waiting for its predecessors (ox.workflow); never claimed.
    PENDING = "PENDING"
    READY = "READY"
    RUNNING = "RUNNING"
    SUCCESSFUL = "SUCCESSFUL"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


FINISHED = (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED)

# The rows that hold their unique key (ox.flow.unique.HOLD_BITS: 1 SUCCESSFUL, 2 FAILED,
# 4 CANCELLED as bits of unique_states), written as IN lists so every database's partial
# index can say it.
UNIQUE_HELD = Q(unique_key__isnull=False) & (
    Q(status__in=["READY", "RUNNING"])
    | Q(status="SUCCESSFUL", unique_states__in=[1, 3, 5, 7])
    | Q(status="FAILED", unique_states__in=[2, 3, 6, 7])
    | Q(status="CANCELLED", unique_states__in=[4, 5, 6, 7])
)


class TaskQuerySet(models.QuerySet["Task"]):
    def ready(self) -> "TaskQuerySet":
        return self.filter(status=Status.READY)

    def running(self) -> "TaskQuerySet":
        return self.filter(status=Status.RUNNING)

    def finished(self) -> "TaskQuerySet":
        return self.filter(status__in=FINISHED)


class TaskBase(models.Model):
    """The columns of a task, shared by the hot table (ox_task) and the archive
    (ox_task_archive), so a row moves between them column for column."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task_path = models.CharField(max_length=255)
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.READY)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    run_after = models.DateTimeField()  # when the task is next due (a retry moves it)
    # The run_after the task was enqueued with (None: at once); Django's TaskResult.task shows it.
    scheduled_for = models.DateTimeField(null=True, blank=True)
    # Whether the task's function is async, known at enqueue: a claim asks for each kind only
    # as many as that kind's free slots, so a worker never claims what it cannot start.
    is_async = models.BooleanField(default=False, db_default=False)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    # The lease: who holds the task and until when. worker_id stays after the task finishes,
    # as the worker of its final attempt.
    worker_id = models.CharField(max_length=128, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Bumped by every claim and every rescue; a worker's writes carry the value it claimed
    # with, so a worker whose lease was taken cannot write its late result.
    fence = models.PositiveIntegerField(default=0)
    return_value = models.JSONField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # Flow control (ox.flow). unique_key: the task's uniqueness key (ox.flow.unique), held
    # while the row is in ox_task_unique's predicate; unique_states: the finished statuses
    # that keep holding it (bits: 1 SUCCESSFUL, 2 FAILED, 4 CANCELLED); unique_until: the end
    # of its period's window (None: no period). limit_key: the key its queue's per-key
    # concurrency and rate limits count it under.
    unique_key = models.CharField(max_length=64, null=True, blank=True)
    unique_states = models.PositiveSmallIntegerField(default=0, db_default=0)
    unique_until = models.DateTimeField(null=True, blank=True)
    limit_key = models.CharField(max_length=200, null=True, blank=True)
    # What the task says about itself beyond its arguments (Django's proposed task metadata:
    # `using(metadata=...)`, `context.metadata`, `save_metadata()`), e.g. its progress. NULL
    # until something is given: an enqueue without metadata writes nothing more.
    metadata = models.JSONField(null=True, blank=True)
    # The workflow (ox.workflow) the task belongs to, and how many of its predecessors have
    # not finished yet: a PENDING task becomes READY in the transaction that counts it to 0.
    workflow_id = models.UUIDField(null=True, blank=True)
    waiting = models.PositiveIntegerField(default=0, db_default=0)

    objects = TaskQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.task_path} [{self.status}] {self.id}"


class Task(TaskBase):
    """Live tasks and the recently finished ones. ox.archive moves rows finished more than
    ARCHIVE_AFTER ago to ArchivedTask, so this table and its partial indexes stay at the size
    of the backlog plus a few minutes of history."""

    class Meta:
        db_table = "ox_task"
        indexes = [
            PartialIndex(
                fields=["queue", "is_async", "-priority", "run_after", "id"],
                name="ox_task_ready_claim",
                condition=Q(status="READY"),
            ),
            PartialIndex(fields=["lease_expires_at"], name="ox_task_running_lease", condition=Q(status="RUNNING")),
            # Finished rows only: an enqueue then maintains just the primary key and the
            # READY index.
            PartialIndex(
                fields=["status", "finished_at"],
                name="ox_task_status_finished",
                condition=Q(status__in=["SUCCESSFUL", "FAILED", "CANCELLED"]),
            ),
            # The task list filtered by task path, newest first, over finished rows (0004 made
            # it with plain SQL; declared here since 0008, so SQLite's table rebuilds keep it).
            PartialIndex(
                fields=["task_path", "id"],
                name="ox_task_done_path",
                condition=Q(status__in=["SUCCESSFUL", "FAILED", "CANCELLED"]),
            ),
            # Failed and cancelled tasks of a queue, newest first (the task list), and "retry
            # all N matching" counts from the index alone (0004; (status, queue, id) since 0008).
            PartialIndex(
                fields=["status", "queue", "id"],
                name="ox_task_failed_queue",
                condition=Q(status__in=["FAILED", "CANCELLED"]),
            ),
            # The task list and the admin filtered by queue, newest first, over finished rows
            # (READY and RUNNING rows come from the claim and lease indexes): without it, a
            # queue that matches nothing is a scan of the whole history. Partial, so enqueues
            # and claims never write it; a completion adds one entry.
            PartialIndex(
                fields=["queue", "id"],
                name="ox_task_done_queue",
                condition=Q(status__in=["SUCCESSFUL", "FAILED", "CANCELLED"]),
            ),
            # The task list and the admin search by task path over READY rows (the claim index
            # has no path: a path matching nothing read every READY row). An enqueue adds one
            # entry; a claim none (the claimed row is RUNNING, outside the predicate). (0010)
            PartialIndex(fields=["task_path", "id"], name="ox_task_ready_path", condition=Q(status="READY")),
            # Failed or cancelled tasks newest first, without walking the primary key through
            # the READY backlog (the newest ids) to find them. Only failures and cancels write it.
            PartialIndex(
                fields=["status", "id"],
                name="ox_task_failed_status",
                condition=Q(status__in=["FAILED", "CANCELLED"]),
            ),
            # The gate's count of what runs per queue and per limit key (ox.flow.gate): as
            # small as the RUNNING set. A claim adds one entry; nothing else writes it.
            PartialIndex(fields=["queue", "limit_key"], name="ox_task_running_queue", condition=Q(status="RUNNING")),
            # The gate's walk past full keys (ox.flow.keywalk): a queue's keys in order, and each
            # key's first task in claim order. Only READY tasks with a limit key are in it.
            PartialIndex(
                fields=["queue", "limit_key", "is_async", "-priority", "run_after", "id"],
                name="ox_task_ready_key",
                condition=Q(status="READY", limit_key__isnull=False),
            ),
            # A workflow's tasks (its page, its repair), and the PENDING ones the repair sweep
            # walks in id order: tasks outside workflows are in neither.
            PartialIndex(
                fields=["workflow_id"],
                name="ox_task_workflow",
                condition=Q(workflow_id__isnull=False),
                fallback=["workflow_id"],
            ),
            PartialIndex(fields=["id"], name="ox_task_pending", condition=Q(status="PENDING")),
        ]
        constraints = [
            # Unique tasks (ox.flow.unique): a key is held while READY or RUNNING, and in a
            # finished status its unique_states name. Rows without a key are not in it.
            PartialUnique(fields=["unique_key"], name="ox_task_unique", condition=UNIQUE_HELD),
            models.CheckConstraint(
                condition=Q(priority__gte=TASK_MIN_PRIORITY, priority__lte=TASK_MAX_PRIORITY),
                name="ox_task_priority_range",
            ),
            models.CheckConstraint(condition=Q(attempts__lte=F("max_attempts")), name="ox_task_attempts_budget"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="ox_task_max_attempts_positive"),
        ]


class ArchivedTask(TaskBase):
    """Finished tasks moved out of ox_task by ox.archive (append-mostly: rows leave only by
    pruning or a retry that moves them back). Its indexes serve what reads it: pruning by
    (status, finished_at), the dashboard's and the admin's newest-first lists by queue, path
    and status, and "retry all matching" counts by (status, queue). None is partial: every row
    here is finished."""

    class Meta:
        db_table = "ox_task_archive"
        verbose_name = "archived task"
        indexes = [
            models.Index(fields=["status", "finished_at"], name="ox_archive_status_finished"),
            models.Index(fields=["queue", "id"], name="ox_archive_queue"),
            models.Index(fields=["task_path", "id"], name="ox_archive_path"),
            models.Index(fields=["status", "id"], name="ox_archive_status"),
            # Failures are few: a partial index keeps "retry all N matching" of a queue an
            # index-only count of its failures, however many successes the archive holds.
            PartialIndex(
                fields=["status", "queue", "id"],
                name="ox_archive_failed_queue",
                condition=Q(status__in=["FAILED", "CANCELLED"]),
            ),
            PartialIndex(
                fields=["workflow_id"],
                name="ox_archive_workflow",
                condition=Q(workflow_id__isnull=False),
                fallback=["workflow_id"],
            ),
        ]


class Outcome(models.TextChoices):
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    CANCELLED = "cancelled"


class Attempt(models.Model):
    """An attempt that did not succeed; the happy path writes none."""

    # No database constraint: an archived task's attempts stay here while its row moves to
    # ox_task_archive (and back on a retry). Raw deletes of tasks delete their attempts
    # explicitly (ox.prune); the ORM's cascade still covers Task deletes.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, db_constraint=False, related_name="failed_attempts")
    number = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=128, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    exception_class_path = models.CharField(max_length=255, blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        db_table = "ox_attempt"
        ordering = ["task", "number"]
        indexes = [models.Index(fields=["finished_at"], name="ox_attempt_finished")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.task_id}: {self.outcome}"


class Step(models.Model):
    """A durable step's recorded result (ox.steps): one row per task and step name, written
    when the step first returned, fenced to the attempt that ran it. Like ox_attempt, keyed
    by task id without a constraint, so it stays with a task that moves to the archive."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, db_constraint=False, related_name="steps")
    name = models.CharField(max_length=200)
    result = models.JSONField(null=True)
    attempt = models.PositiveIntegerField()  # the attempt that ran it
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        db_table = "ox_step"
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="ox_step_task_name")]

    def __str__(self) -> str:
        return f"step {self.name!r} of {self.task_id}"


class Worker(models.Model):
    id = models.CharField(primary_key=True, max_length=128)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=1)
    # PostgreSQL, MariaDB: the worker holds a session lock (advisory, named) on this key for its life, so a
    # rescuer can tell a dead worker from a slow one without waiting for its leases.
    lock_key = models.IntegerField(default=0)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    # PostgreSQL, MariaDB: when a rescuer first found this worker's liveness lock free. A live worker
    # that reconnects within the grace (its heartbeat clears this) keeps its tasks.
    lock_lost_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # PostgreSQL, MariaDB: set while the worker waits with free slots, so enqueues of its queues notify
    # (ox.idle, migration 0012); a busy worker clears it and producers stop notifying.
    idle_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ox_worker"
        indexes = [
            models.Index(fields=["heartbeat_at"], name="ox_worker_heartbeat"),
            # The enqueue trigger's look for a waiting worker: only marked, running rows.
            PartialIndex(
                fields=["idle_since"],
                name="ox_worker_idle",
                condition=Q(idle_since__isnull=False, stopped_at__isnull=True),
                fallback=["stopped_at", "idle_since"],
            ),
        ]

    def __str__(self) -> str:
        return self.id


class Tick(models.Model):
    """One row per fired tick of a periodic schedule. The unique (schedule, tick_at) pair is
    what makes a tick fire once however many workers race for it."""

    schedule = models.CharField(max_length=100)
    tick_at = models.DateTimeField()  # the tick's due time, as the schedule computes it
    fired_at = models.DateTimeField()
    task_id = models.UUIDField(null=True, blank=True)  # no FK: pruning tasks keeps the ticks
    missed = models.PositiveIntegerField(default=0)  # ticks skipped just before this one

    class Meta:
        db_table = "ox_tick"
        constraints = [models.UniqueConstraint(fields=["schedule", "tick_at"], name="ox_tick_once")]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.tick_at.isoformat()}"


class QueueState(models.Model):
    """A queue's run-time state (ox.flow.queues): paused or not, limits overriding the
    settings' LIMITS, and the rate limit's schedule. Its row is also the lock the gate takes
    to claim from a limited queue (ox.flow.gate), so limited claims of one queue are one at
    a time across all workers."""

    name = models.CharField(primary_key=True, max_length=64)
    paused = models.BooleanField(default=False, db_default=False)
    # Limit fields set at run time (the dashboard): present keys win over the settings,
    # None included (None lifts that limit). {} : the settings hold.
    overrides = models.JSONField(default=dict, blank=True)
    # Whether the overrides set any limit: the claim for unlimited queues skips such a queue
    # even before a worker has read its overrides.
    limited = models.BooleanField(default=False, db_default=False)
    # GCRA for the queue's rate limit: the theoretical time of the next start (epoch seconds).
    rate_tat = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "ox_queue"
        verbose_name = "queue"

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"


class KeyRate(models.Model):
    """GCRA state of a per-key rate limit (ox.flow.gate): a row per (queue, limit key) that
    started a task lately; rows whose time has passed say nothing and are pruned."""

    queue = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    tat = models.FloatField()  # epoch seconds

    class Meta:
        db_table = "ox_key_rate"
        constraints = [models.UniqueConstraint(fields=["queue", "key"], name="ox_key_rate_once")]
        indexes = [models.Index(fields=["tat"], name="ox_key_rate_tat")]


class Slot(models.Model):
    """One of a queue's `concurrency` slots (ox.flow.slots): a worker leases slots and runs at
    most as many of the queue's tasks at once as it holds. worker_id is empty when the slot is
    free; a lease that ran out (its worker stopped renewing) frees it too."""

    queue = models.CharField(max_length=64)
    n = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=128, blank=True, default="", db_default="")
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ox_slot"
        constraints = [models.UniqueConstraint(fields=["queue", "n"], name="ox_slot_once")]
        indexes = [models.Index(fields=["worker_id"], name="ox_slot_worker")]

    def __str__(self) -> str:
        return f"{self.queue}#{self.n}"


from ox.workflow.models import Edge, Workflow  # noqa: E402, F401  (the workflow tables, same app)
