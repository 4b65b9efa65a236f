from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.access import can_change_tasks, view_task_required
from dashboard.filters import TaskFilter
from dashboard.rendering import render_page
from dashboard.timeline import attempt_rows, events
from ox import stats
from ox.flow.waiting import why_waiting
from ox.models import FINISHED, ArchivedTask, Status, Task
from ox.operations import RETRYABLE
from ox.paging import COUNT_CAP, CappedPaginator, NewestFirst

PAGE_SIZE = 50
LIST_COLUMNS = (
    "id",
    "task_path",
    "queue",
    "priority",
    "status",
    "enqueued_at",
    "finished_at",
    "attempts",
    "max_attempts",
    "cancel_requested",
)


@view_task_required
def task_list(request: HttpRequest) -> HttpResponse:
    filterset = TaskFilter(request.GET or None, queryset=Task.objects.order_by("-id").only(*LIST_COLUMNS))
    tasks: QuerySet[Task] | NewestFirst
    if filterset.is_bound and not filterset.is_valid():
        # An invalid filter shows its errors over an empty list: never everything, never a 500.
        tasks = Task.objects.none()
    elif filterset.reads_archive:
        # Finished tasks older than ARCHIVE_AFTER are in the archive: both tables, merged by id.
        tasks = NewestFirst(filterset.qs, filterset.for_archive(ArchivedTask.objects.only(*LIST_COLUMNS)))
    else:
        tasks = filterset.qs
    paginator = CappedPaginator(tasks, PAGE_SIZE, cap=COUNT_CAP)
    page = paginator.get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "filter": filterset,
        "page": page,
        "paginator": paginator,
        "query": query.urlencode(),
        "now": timezone.now(),
        "can_change": can_change_tasks(request),
        "filtered": filterset.is_bound and filterset.is_valid() and any(filterset.form.cleaned_data.values()),
    }
    return render_page(request, "dashboard/tasks.html", context, "table")


@view_task_required
def task_detail(request: HttpRequest, pk: str) -> HttpResponse:
    task = stats.find_task(pk)
    if task is None:
        raise Http404("No such task.")
    attempts = attempt_rows(task, stats.attempts_of(task))
    context = {
        "task": task,
        "attempts": attempts,
        "steps": stats.steps_of(task),
        "events": events(task, attempts),
        "now": timezone.now(),
        "active": task.status not in FINISHED,
        "can_retry": task.status in RETRYABLE,
        # PENDING: a workflow's waiting task, which ox.cancel takes too (ox.workflow).
        "can_cancel": task.status in (Status.PENDING, Status.READY, Status.RUNNING) and not task.cancel_requested,
        "can_change": can_change_tasks(request),
        # Only a READY task waits; the others cost no query here (an archived row is never READY).
        "waiting": why_waiting(task) if task.status == Status.READY else None,
    }
    return render_page(request, "dashboard/task_detail.html", context, "live")
