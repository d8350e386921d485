"use strict";
// Held-back evaluation (evaluation/held_back.py): success on tasks the run does not train on, against wall-clock
// minutes since the run began (time/elapsed_s), beside the training reward at the same times, so a reward that
// rises while held-back success falls shows at a glance. Drawn first among the training charts, only when the
// run evaluated. Runs after the main script (it uses DATA, el, lineChart and COLORS).
(function () {
  const timed = DATA.metrics.filter(r => typeof r["time/elapsed_s"] === "number");
  const at = key => timed.filter(r => typeof r[key] === "number").map(r => [r["time/elapsed_s"] / 60, r[key]]);
  const success = at("eval/success");
  if (!success.length) return;
  const box = el("div", {class: "chart", id: "chart-held-back"});
  document.getElementById("main-charts").prepend(box);
  lineChart(box, {key: "held-back", title: "Held-back success and training reward, by wall-clock minutes",
    xName: "minute", yMin: 0, series: [
      {name: "held-back success", color: COLORS[2], points: success},
      {name: "held-back mean score", color: COLORS[3], points: at("eval/mean_score")},
      {name: "training reward", color: COLORS[0], points: at("reward")}]});
})();
