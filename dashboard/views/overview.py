from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.access import view_task_required
from dashboard.rendering import render_page
from ox import stats
from ox.flow.queues import QueueView, views
from ox.flow.waiting import settings_limits
from ox.paging import COUNT_CAP
from ox.stats import QueueStats


@dataclass(frozen=True)
class QueueRow:
    """A queue's line on the overview: its counts, and its pause and limits."""

    stats: QueueStats
    view: QueueView

    @property
    def full(self) -> bool:
        # queue_flows()' rule for "at its concurrency limit", on the running count the overview
        # has already read: queue_flows() itself would cost four more queries every 2 s poll.
        limit = self.view.limits.concurrency
        return limit is not None and self.stats.running >= limit


def queue_rows(data: stats.Overview) -> list[QueueRow]:
    """One query (the ox_queue rows) on top of the overview's own."""
    found = {v.name: v for v in views(settings_limits(), [q.queue for q in data.queues])}
    return [QueueRow(q, found[q.queue]) for q in data.queues]


@view_task_required
def overview(request: HttpRequest) -> HttpResponse:
    data = stats.overview()
    chart = {
        "labels": [timezone.localtime(m).strftime("%H:%M") for m in data.minutes],
        "series": [
            {"label": "succeeded", "data": data.succeeded_per_minute, "color": "#2f9e6b"},
            {"label": "failed", "data": data.failed_per_minute, "color": "#d64545"},
        ],
    }
    context = {
        "overview": data,
        "rows": queue_rows(data),
        "chart": chart,
        "count_cap": COUNT_CAP,
        "reporting": stats.reporting(),
    }
    return render_page(request, "dashboard/overview.html", context, "live")
