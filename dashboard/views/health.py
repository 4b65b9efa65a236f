"""Periodic schedules and the queue table's health (PostgreSQL's or InnoDB's), each section its own partial."""

from datetime import datetime

from django.db import connections, router
from django.http import HttpRequest, HttpResponse
from django.tasks import task_backends
from django.utils import timezone

from dashboard.access import view_task_required
from dashboard.rendering import render_page
from ox.backend import OxBackend
from ox.models import Task
from ox.periodic import schedule_status
from ox.tablehealth import DEFAULT_MAX_XACT_AGE, table_health

PARTS = ("schedules", "table")  # ?part= picks one section; an htmx request without it gets both


def max_xact_age() -> float:
    """The strictest HEALTH_MAX_XACT_AGE of the ox backends, as `manage.py ox_health` reads it."""
    ages = [b.config.health_max_xact_age for b in task_backends.all() if isinstance(b, OxBackend)]
    return min(ages, default=DEFAULT_MAX_XACT_AGE)


@view_task_required
def health(request: HttpRequest, now: datetime | None = None) -> HttpResponse:
    """`now`: the clock the page is rendered at (tests pass a fixed one; a URL never does)."""
    part = request.GET.get("part")
    part = part if part in PARTS else None
    now = now or timezone.now()
    context: dict[str, object] = {"now": now}
    if part in (None, "schedules"):
        context["schedules"] = schedule_status(now)
    if part in (None, "table"):
        database = connections[router.db_for_read(Task)]  # the one table_health() reads
        context["database"] = database.display_name
        context["postgres"] = database.vendor == "postgresql"
        context["innodb"] = database.vendor == "mysql"  # MariaDB, MySQL: InnoDB's figures instead
        context["table"] = table_health(max_xact_age=max_xact_age())
    if part is None:
        context["retention"] = retention()
    return render_page(request, "dashboard/health.html", context, part or "live")


def retention() -> list[dict[str, object]]:
    """Per ox backend, the retention in force: seconds per finished status (SUCCESSFUL,
    CANCELLED, FAILED; None: kept), of worker rows, and until the archive (None: never)."""
    out: list[dict[str, object]] = []
    for backend in task_backends.all():
        if not isinstance(backend, OxBackend):
            continue
        rules, options = backend.config.prune_rules(), backend.config
        workers, archive = options.worker_retention(), options.archive_age()
        out.append(
            {
                "backend": backend.alias,
                "statuses": [
                    rules[s].total_seconds() if s in rules else None for s in ("SUCCESSFUL", "CANCELLED", "FAILED")
                ],
                "workers": None if workers is None else workers.total_seconds(),
                "archive": None if archive is None else archive.total_seconds(),
            }
        )
    return out
