"""Prometheus metrics (text exposition format 0.0.4) at /ox/metrics, for a bearer token
(settings.OX_METRICS_TOKEN, else the OX_METRICS_TOKEN environment variable) or the login of a
staff user who may view tasks.

Counts come from the database at scrape time, so every web process reports the same
numbers. The backlog's counts stop at ox.paging.COUNT_CAP per queue (ox_tasks_capped says
when), read from the claim index alone; the oldest ready age is exact. Finished tasks and
failed attempts are counted over a recent window (indexed range scans), not over the whole
table: a whole-table count is a table scan per scrape.
"""

import hmac
import os
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ox import clock
from ox.health import queue_counts, worker_counts
from ox.models import FINISHED, ArchivedTask, Attempt, Outcome, Task
from ox.paging import COUNT_CAP
from ox.periodic import schedule_status
from ox.stats import each_status
from ox.tablehealth import InnoDBTableHealth, table_health

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WINDOW = timedelta(minutes=5)
STALE_AFTER = 60.0  # seconds; the default backend's WORKER_STALE_AFTER applies when set

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")
    return lines


def _configured() -> tuple[set[str], float]:
    """Queues declared by ox backends, and the default backend's stale-after."""
    from django.tasks import task_backends

    from ox.backend import OxBackend

    queues: set[str] = set()
    stale_after = STALE_AFTER
    for alias in getattr(settings, "TASKS", {}):
        backend = task_backends[alias]
        if isinstance(backend, OxBackend):
            queues |= set(backend.queues)
            if alias == "default":
                stale_after = backend.config.worker_stale_after
    return queues, stale_after


def render_metrics(now: datetime | None = None, using: str | None = None) -> str:
    now = now or clock.now_on(using)
    queues, stale_after = _configured()
    counts = queue_counts(now, using, queues)
    tasks = Task.objects.using(using) if using else Task.objects.all()
    attempts = Attempt.objects.using(using) if using else Attempt.objects.all()
    since = now - WINDOW
    archived = ArchivedTask.objects.using(using) if using else ArchivedTask.objects.all()
    # A task finished within the window is in ox_task, or already in the archive when
    # ARCHIVE_AFTER is shorter than the window: both in one statement (UNION ALL), each table
    # through its (status, finished_at) index.
    finished = [
        table.filter(each_status(FINISHED), finished_at__gte=since).values("queue", "status").annotate(n=Count("pk"))
        for table in (tasks, archived)
    ]
    finished_by: dict[tuple[str, str], int] = {}
    for r in finished[0].order_by().union(finished[1].order_by(), all=True):
        finished_by[(r["queue"], r["status"])] = finished_by.get((r["queue"], r["status"]), 0) + r["n"]
    outcomes = attempts.filter(finished_at__gte=since).values("outcome").annotate(n=Count("pk")).order_by()
    failed_by = {r["outcome"]: r["n"] for r in outcomes}
    workers = worker_counts(now, stale_after, using)

    out: list[str] = []
    out += _family(
        "ox_tasks",
        "gauge",
        "Live tasks per queue and state: READY (due now), SCHEDULED (READY, run_after in the future), RUNNING."
        f" READY and SCHEDULED are counted up to {COUNT_CAP} (see ox_tasks_capped).",
        [
            ({"queue": q.queue, "status": status}, value)
            for q in counts
            for status, value in (("READY", q.ready), ("SCHEDULED", q.scheduled), ("RUNNING", q.running))
        ],
    )
    out += _family(
        "ox_tasks_capped",
        "gauge",
        f"1 when the queue's ox_tasks count stopped at {COUNT_CAP}: there are more (counting a backlog of"
        " millions exactly would cost a scan per scrape).",
        [
            ({"queue": q.queue, "status": status}, int(flag))
            for q in counts
            for status, flag in (("READY", q.ready_capped), ("SCHEDULED", q.scheduled_capped))
        ],
    )
    out += _family(
        "ox_oldest_ready_age_seconds",
        "gauge",
        "Seconds the oldest due READY task of the queue has waited (0 when none).",
        [({"queue": q.queue}, round(q.oldest_ready_age, 3)) for q in counts],
    )
    out += _family(
        "ox_tasks_finished_recent",
        "gauge",
        f"Tasks that finished in the last {int(WINDOW.total_seconds())} seconds, per queue and final status.",
        [
            ({"queue": q, "status": s}, finished_by.get((q, s), 0))
            for q in sorted(queues | {k[0] for k in finished_by})
            for s in FINISHED
        ],
    )
    out += _family(
        "ox_attempts_failed_recent",
        "gauge",
        f"Attempts that did not succeed in the last {int(WINDOW.total_seconds())} seconds, per outcome.",
        [({"outcome": o}, failed_by.get(o, 0)) for o in Outcome.values],
    )
    out += _family(
        "ox_workers",
        "gauge",
        f"Workers heartbeating (alive) and silent for over {stale_after:g}s without stopping (stale).",
        [({"state": "alive"}, workers.alive), ({"state": "stale"}, workers.stale)],
    )
    out += _schedule_lines(now, using)
    out += _table_lines(using)
    out += _family("ox_metrics_window_seconds", "gauge", "Window of the *_recent metrics.", [({}, WINDOW.seconds)])
    return "\n".join(out) + "\n"


def _schedule_lines(now: datetime, using: str | None) -> list[str]:
    statuses = schedule_status(now, using)
    if not statuses:
        return []
    return [
        *_family(
            "ox_schedule_last_tick_timestamp_seconds",
            "gauge",
            "Unix time of the schedule's newest recorded tick (0: none yet).",
            [({"schedule": s.name}, s.last_tick_at.timestamp() if s.last_tick_at else 0) for s in statuses],
        ),
        *_family(
            "ox_schedule_next_tick_timestamp_seconds",
            "gauge",
            "Unix time of the schedule's next tick.",
            [({"schedule": s.name}, s.next_tick_at.timestamp() if s.next_tick_at else 0) for s in statuses],
        ),
        *_family(
            "ox_schedule_missed",
            "gauge",
            "1 when the schedule's due tick is overdue or was skipped.",
            [({"schedule": s.name}, int(s.missed)) for s in statuses],
        ),
    ]


def _table_lines(using: str | None) -> list[str]:
    table = table_health(using)
    if table is None:
        return []
    if isinstance(table, InnoDBTableHealth):
        return _innodb_table_lines(table)
    label = {"table": table.table}
    oldest = table.oldest_transaction.age_seconds if table.oldest_transaction else 0.0
    return [
        *_family("ox_table_live_tuples", "gauge", "Live rows (PostgreSQL statistics).", [(label, table.live_tuples)]),
        *_family("ox_table_dead_tuples", "gauge", "Dead row versions not yet vacuumed.", [(label, table.dead_tuples)]),
        *_family(
            "ox_table_bytes",
            "gauge",
            "Size on disk: heap, indexes, total with TOAST.",
            [
                ({**label, "part": "heap"}, table.table_bytes),
                ({**label, "part": "indexes"}, table.index_bytes),
                ({**label, "part": "total"}, table.total_bytes),
            ],
        ),
        *_family(
            "ox_oldest_transaction_age_seconds",
            "gauge",
            "Age of the oldest open transaction in the database, which holds back VACUUM.",
            [({}, round(oldest, 3))],
        ),
    ]


def _innodb_table_lines(table: InnoDBTableHealth) -> list[str]:
    """The InnoDB counterparts under the PostgreSQL names where the meaning carries over (sizes,
    oldest transaction); no dead tuples (InnoDB has none), and the history list length, InnoDB's
    purge lag, under its own name and only when the server lets it be read."""
    label = {"table": table.table}
    oldest = table.oldest_transaction.age_seconds if table.oldest_transaction else 0.0
    out = [
        *_family(
            "ox_table_estimated_rows",
            "gauge",
            "Rows as InnoDB estimates them (information_schema.TABLES.TABLE_ROWS).",
            [(label, table.estimated_rows)],
        ),
        *_family(
            "ox_table_bytes",
            "gauge",
            "Size on disk: data (clustered index), secondary indexes, free in its tablespace, total data + indexes.",
            [
                ({**label, "part": "data"}, table.data_bytes),
                ({**label, "part": "indexes"}, table.index_bytes),
                ({**label, "part": "free"}, table.free_bytes),
                ({**label, "part": "total"}, table.total_bytes),
            ],
        ),
    ]
    if table.history_list_length is not None:
        out += _family(
            "ox_innodb_history_list_length",
            "gauge",
            "Undo log records waiting for InnoDB purge (trx_rseg_history_len), server-wide.",
            [({}, table.history_list_length)],
        )
    if table.transactions_visible:  # else unknown, which a 0 would misreport as "none open"
        out += _family(
            "ox_oldest_transaction_age_seconds",
            "gauge",
            "Age of the oldest open transaction on the server, which holds back InnoDB purge.",
            [({}, round(oldest, 3))],
        )
    return out


def _token() -> str:
    return getattr(settings, "OX_METRICS_TOKEN", "") or os.environ.get("OX_METRICS_TOKEN", "")


def _authorized(request: HttpRequest) -> bool | None:
    """True: let in. False: known but not allowed (403). None: not authenticated (401).
    A session counts when it may view tasks, as in the admin: active staff with ox.view_task
    (or ox.change_task); queue names and counts are task data."""
    token = _token()
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return True
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return bool(
            user.is_active and user.is_staff and (user.has_perm("ox.view_task") or user.has_perm("ox.change_task"))
        )
    return None


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    allowed = _authorized(request)
    if allowed is None:
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="ox metrics"'
        return response
    if not allowed:
        return HttpResponse("staff with ox.view_task only\n", status=403, content_type="text/plain")
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE)
