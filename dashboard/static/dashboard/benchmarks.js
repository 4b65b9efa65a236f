// The benchmarks page: before htmx swaps its content (a picker changed, or Back fetched an
// earlier URL of the page), let go of the charts drawn in it. Chart.js keeps every chart it
// draws in its registry, so a swapped-out canvas would leak its chart; and htmx carries the
// attributes of an old element over to the new element with the same id while it settles: the
// inline size Chart.js put on a canvas would be set as a style attribute, which the
// Content-Security-Policy refuses (a reported violation).
(function () {
  "use strict";

  function release(root) {
    if (!root || !window.Chart) return;
    root.querySelectorAll("canvas[data-chart-source]").forEach(function (canvas) {
      var chart = window.Chart.getChart(canvas);
      if (chart) chart.destroy();
      canvas.removeAttribute("style");
    });
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (target && (target.id === "bench-content" || target.querySelector("#bench-content"))) release(target);
  });
  // Back: htmx puts the fetched page into <body> without a beforeSwap.
  document.addEventListener("htmx:historyCacheMissLoad", function (event) {
    if (document.getElementById("bench-content")) release(event.detail.historyElt);
  });
})();
