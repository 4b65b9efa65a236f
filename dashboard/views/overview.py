from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.access import view_task_required
from dashboard.rendering import render_page
from ox import stats
from ox.paging import COUNT_CAP


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
    context = {"overview": data, "chart": chart, "count_cap": COUNT_CAP}
    return render_page(request, "dashboard/overview.html", context, "live")
