"""The benchmarks page: one run's table first (bench/report.py's rows, what `bench/run --report`
prints), then every run over time: one chart per cell for the metric picked, grouped by cell
family in collapsible sections. The pickers are GET parameters (`run`, `metric`), so a view of
the page is a link; htmx swaps the page's content in place when one changes."""

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.utils.text import slugify

from bench import report
from dashboard import bench
from dashboard.access import view_task_required
from dashboard.rendering import render_page

DEFAULT_METRIC = "throughput"
SHORT = 24  # characters of a reason shown in a table cell; the whole of it is its title


def short_reason(why: str) -> str:
    """What a table cell shows of a reason: the harness's reasons lead with their kind ("cannot
    run: PostgreSQL only" reads "cannot run"); others are cut to SHORT characters."""
    kind = why.split(":", 1)[0]
    if ":" in why and len(kind) <= SHORT:
        return kind
    return why if len(why) <= SHORT else why[: SHORT - 1] + "…"


def figure(arm: str, fig: report.ArmFigure) -> dict[str, Any]:
    spread = fig.spread
    if spread is None or fig.value is None:
        spread_text = ""
    elif spread.count == 1:
        spread_text = "1 sample"
    else:
        spread_text = f"{report.number_text(spread.low)}–{report.number_text(spread.high)} ({spread.count})"
    return {
        "arm": arm,
        "value": None if fig.value is None else report.number_text(fig.value),
        "spread": spread_text,
        "samples": 0 if spread is None else spread.count,
        "why": fig.why,
        "short_why": short_reason(fig.why),
    }


def ratio_text(value: float) -> str:
    """Two decimals, or two significant digits below 0.1: 0.0026x, not 0.00x (a 400-fold gap)."""
    if value == 0 or value >= 0.1:
        return f"{value:.2f}×"
    return f"{value:.2g}×" if value >= 0.001 else "<0.001×"


def ratio_cell(peer: str, value: float | None, higher_is_better: bool | None) -> dict[str, Any]:
    if value is None:
        return {"peer": peer, "text": None, "verdict": ""}
    wins = report.ox_wins(value, higher_is_better) if higher_is_better is not None and value != 1 else None
    return {"peer": peer, "text": ratio_text(value), "verdict": {True: "better", False: "worse", None: ""}[wins]}


def table(run: bench.Run) -> dict[str, Any]:
    """The run's rows for the template, consecutive metrics of one cell under one heading."""
    arms = list(run.arms)
    peers = [a for a in arms if a != report.OURS] if report.OURS in arms else []
    cells: list[dict[str, Any]] = []
    for row in run.rows:
        if not cells or (cells[-1]["name"], cells[-1]["db"]) != (row.cell, row.db):
            cells.append({"name": row.cell, "db": row.db, "about": row.about, "settings": row.settings, "rows": []})
            cells[-1]["name_parts"] = row.cell.split("_")  # the template lets long names break after "_"
        cells[-1]["rows"].append(
            {
                "metric": row.metric,
                "unit": row.unit,
                "stat": row.stat,
                "higher_is_better": row.higher_is_better,
                "figures": [figure(a, row.arms[a]) for a in arms],
                "ratios": [ratio_cell(p, row.ratios.get(p), row.higher_is_better) for p in peers],
            }
        )
    return {"arms": arms, "peers": peers, "cells": cells}


def run_choice(run: bench.Run) -> str:
    when = run.started_at.strftime("%Y-%m-%d %H:%M") if run.started_at else run.file
    cells = len({(r.cell, r.db) for r in run.rows})
    scope = ", part of the matrix" if run.subset else ""
    return f"{when} · {run.git_sha[:7] or 'no sha'} · {run.mode or '?'} · {cells} cells{scope}"


@view_task_required
def benchmarks(request: HttpRequest) -> HttpResponse:
    runs = bench.load_runs()
    lead = bench.lead(runs, request.GET.get("run"))
    choices = bench.metrics(runs)
    names = [name for name, _ in choices]
    metric = request.GET.get("metric", "")
    if not metric or metric not in names:
        metric = DEFAULT_METRIC if DEFAULT_METRIC in names else (names[0] if names else "")
    groups = []
    number = 0
    for position, (family, charts) in enumerate(bench.grouped(bench.charts(runs, metric) if metric else [])):
        items = []
        for chart in charts:
            payload = {"labels": chart.labels, "series": chart.series, "unit": chart.unit}
            ids = {"id": f"bench-chart-{number}", "data_id": f"bench-chart-{number}-data"}
            items.append({**ids, "chart": chart, "payload": payload})
            number += 1
        groups.append({"id": f"bench-group-{slugify(family)}", "name": family, "open": position == 0, "charts": items})
    context = {
        "runs": list(reversed(runs)),
        "lead": lead,
        "table": table(lead.run) if lead else None,
        "run_choices": [(r.file, run_choice(r)) for r in reversed(runs) if r.rows],
        "unreadable": [r for r in runs if r.error and not r.cells],
        "metric": metric,
        "metrics": choices,
        "groups": groups,
        "results_dir": bench.results_dir_label(),
    }
    if request.htmx.history_restore_request:
        # Back to a URL of this page: htmx asks for it (the page keeps no snapshot, see the
        # template) to fill <body> with, so the whole page, not the content partial.
        response = render(request, "dashboard/benchmarks.html", context)
        patch_vary_headers(response, ("HX-Request", "HX-History-Restore-Request"))
        add_never_cache_headers(response)
        return response
    return render_page(request, "dashboard/benchmarks.html", context, "content")
