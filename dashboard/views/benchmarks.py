from django.http import HttpRequest, HttpResponse

from dashboard import bench
from dashboard.access import view_task_required
from dashboard.rendering import render_page


@view_task_required
def benchmarks(request: HttpRequest) -> HttpResponse:
    runs = bench.load_runs()
    charts = bench.charts(runs)
    context = {
        "runs": list(reversed(runs)),
        "charts": [
            {
                "id": f"bench-chart-{i}",
                "data_id": f"bench-chart-{i}-data",
                "chart": chart,
                "payload": {"labels": chart.labels, "series": chart.series, "unit": chart.unit},
            }
            for i, chart in enumerate(charts)
        ],
        "results_dir": bench.results_dir_label(),
    }
    return render_page(request, "dashboard/benchmarks.html", context, "content")
