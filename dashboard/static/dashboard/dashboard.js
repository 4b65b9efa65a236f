// The dashboard's few behaviours: charts drawn from JSON the server renders next to them,
// open <details> kept open across live refreshes, and row selection on the task list.
(function () {
  "use strict";

  // Polls on the task list pause while rows are selected, so a refresh never drops a selection.
  // A cancelled htmx:beforeRequest rather than an hx-trigger filter: htmx compiles filters with
  // eval, which the Content-Security-Policy forbids.
  function somethingSelected() {
    return !!document.querySelector('#task-table input[name="ids"]:checked');
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var source = event.detail.elt;
    if (source && source.hasAttribute("data-pause-while-selected") && somethingSelected()) {
      event.preventDefault();
    }
  });

  function chartData(canvas) {
    var source = document.getElementById(canvas.dataset.chartSource);
    if (!source) return null;
    var payload = JSON.parse(source.textContent);
    var type = canvas.dataset.chartType || "line";
    return {
      labels: payload.labels,
      datasets: payload.series.map(function (s) {
        return {
          label: s.label,
          data: s.data,
          backgroundColor: type === "bar" ? s.color : s.color + "33",
          borderColor: s.color,
          borderWidth: s.ours ? 3 : 2,
          pointRadius: type === "line" ? 3 : 0,
          spanGaps: true,
          tension: 0.2,
        };
      }),
    };
  }

  function drawCharts() {
    if (!window.Chart) return;
    document.querySelectorAll("canvas[data-chart-source]").forEach(function (canvas) {
      var data = chartData(canvas);
      if (!data) return;
      var existing = window.Chart.getChart(canvas);
      if (existing) {
        existing.data.labels = data.labels;
        data.datasets.forEach(function (d, i) {
          if (existing.data.datasets[i]) existing.data.datasets[i].data = d.data;
        });
        existing.update("none");
        return;
      }
      var stacked = canvas.dataset.chartType === "bar";
      new window.Chart(canvas, {
        type: canvas.dataset.chartType || "line",
        data: data,
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          interaction: { mode: "index", intersect: false },
          scales: {
            x: { stacked: stacked, ticks: { maxRotation: 0, autoSkipPadding: 12 } },
            y: { stacked: stacked, beginAtZero: true },
          },
          plugins: { legend: { position: "bottom" } },
        },
      });
      canvas.dataset.drawn = "true";
    });
  }

  var openDetails = [];
  document.addEventListener("htmx:beforeSwap", function (event) {
    openDetails = Array.from(event.detail.target.querySelectorAll("details[open][id]")).map(function (d) {
      return d.id;
    });
  });
  document.addEventListener("htmx:afterSettle", function () {
    openDetails.forEach(function (id) {
      var d = document.getElementById(id);
      if (d) d.open = true;
    });
    openDetails = [];
    drawCharts();
  });

  document.addEventListener("change", function (event) {
    var all = event.target.closest("[data-select-all]");
    if (!all) return;
    document.querySelectorAll('#task-table input[name="ids"]').forEach(function (box) {
      box.checked = all.checked;
    });
  });

  document.addEventListener("DOMContentLoaded", drawCharts);
})();
