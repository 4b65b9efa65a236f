from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.access import can_change_tasks, view_task_required
from dashboard.rendering import render_page
from ox import stats


@view_task_required
def running(request: HttpRequest) -> HttpResponse:
    leases, total = stats.leases()
    context = {"leases": leases, "total": total, "now": timezone.now(), "can_change": can_change_tasks(request)}
    return render_page(request, "dashboard/running.html", context, "live")
