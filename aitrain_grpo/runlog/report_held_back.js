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
  const gain = DATA.held_back_gain;  // report.py held_back_gain: first and last evaluation, hours between
  if (gain) {
    const sign = gain.per_hour >= 0 ? "+" : "";
    // the gain's 95% interval over the tasks both evaluations played (evaluation/paired.py), when there is one
    const interval = gain.interval ? `; the gain's 95% interval [${gain.interval.map(v => (v >= 0 ? "+" : "") + v.toFixed(3)).join(", ")}]` +
      (gain.interval[0] <= 0 && gain.interval[1] >= 0 ? ", a tie" : "") : "";
    box.append(el("p", {class: "held-back-gain"}, `held-back success ${gain.first.toFixed(3)} -> ${gain.last.toFixed(3)} ` +
      `in ${gain.hours.toFixed(2)} h of training: ${sign}${gain.per_hour.toFixed(3)} an hour${interval}`));
  }
  lineChart(box, {key: "held-back", title: "Held-back success and training reward, by wall-clock minutes",
    xName: "minute", yMin: 0, series: [
      {name: "held-back success", color: COLORS[2], points: success},
      {name: "held-back mean score", color: COLORS[3], points: at("eval/mean_score")},
      {name: "training reward", color: COLORS[0], points: at("reward")}]});
})();
