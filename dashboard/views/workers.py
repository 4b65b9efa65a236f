from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.access import view_task_required
from dashboard.rendering import render_page
from ox import stats


@view_task_required
def workers(request: HttpRequest, now: datetime | None = None) -> HttpResponse:
    """`now`: the clock the page is rendered at (tests pass a fixed one; a URL never does)."""
    now = now or timezone.now()
    states = stats.workers(now)
    context = {
        "workers": states,
        "live_count": sum(s.state == "live" for s in states),
        "stale_after": stats.STALE_HEARTBEATS * stats.heartbeat_interval(),
        "now": now,
    }
    return render_page(request, "dashboard/workers.html", context, "live")
