"""Workflows (ox.workflow): the newest ones with their tasks' statuses counted, and one
workflow drawn as a graph of its tasks (live), with a retry of its failed part."""

import uuid
from collections import defaultdict

from django.contrib import messages
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone

from dashboard.access import can_change_tasks, change_task_required, view_task_required
from dashboard.graph import layout
from dashboard.rendering import render_page
from dashboard.views.actions import back
from ox.models import ArchivedTask, Edge, Status, Task, Workflow
from ox.workflow.retry import StillRunning, retry_failed_part

LIST_SIZE = 50
UNFINISHED = (Status.PENDING, Status.READY, Status.RUNNING)


@view_task_required
def workflow_list(request: HttpRequest) -> HttpResponse:
    flows = list(Workflow.objects.order_by("-created_at", "-id")[:LIST_SIZE])
    counts: dict[uuid.UUID, dict[str, int]] = defaultdict(dict)
    ids = [f.id for f in flows]
    for model in (Task, ArchivedTask):
        rows = model.objects.filter(workflow_id__in=ids).values("workflow_id", "status").annotate(n=Count("id"))
        for row in rows.order_by():
            found = counts[row["workflow_id"]]
            found[row["status"]] = found.get(row["status"], 0) + row["n"]
    rows = [
        {
            "flow": f,
            "counts": sorted(counts[f.id].items()),
            "total": sum(counts[f.id].values()),
            "active": any(counts[f.id].get(s) for s in UNFINISHED),
        }
        for f in flows
    ]
    return render_page(request, "dashboard/workflows.html", {"rows": rows, "now": timezone.now()}, "live")


@view_task_required
def workflow_detail(request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
    flow = get_object_or_404(Workflow, pk=pk)
    found = []
    for model in (Task, ArchivedTask):
        found += model.objects.filter(workflow_id=flow.id).values_list("id", "task_path", "status")
    found.sort(key=lambda t: t[0])  # uuid7: the order they were enqueued in
    edges = Edge.objects.filter(workflow_id=flow.id).values_list("parent_id", "child_id")
    drawing = layout(found, edges)
    statuses = dict(drawing.counts)
    context = {
        "flow": flow,
        "drawing": drawing,
        "active": any(statuses.get(s) for s in UNFINISHED),
        "failed": statuses.get(Status.FAILED, 0) + statuses.get(Status.CANCELLED, 0),
        "can_change": can_change_tasks(request),
        "now": timezone.now(),
    }
    return render_page(request, "dashboard/workflow_detail.html", context, "live")


@change_task_required
def retry_workflow(request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
    flow = get_object_or_404(Workflow, pk=pk)
    try:
        reset = retry_failed_part(flow.id)
    except StillRunning as exc:
        messages.warning(request, str(exc))
    else:
        if reset:
            plural = "s" if reset != 1 else ""
            messages.success(request, f"Retrying {reset} task{plural}: what failed and what follows it.")
        else:
            messages.warning(request, "Nothing in this workflow failed: nothing to retry.")
    return back(request, reverse("dashboard:workflow", args=[flow.id]))
