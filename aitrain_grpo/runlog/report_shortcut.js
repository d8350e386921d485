"use strict";
// The shortcut warning on the page (runlog/shortcuts.py): the score rose while a behaviour that usually means a
// gamed score moved with it. Marks the charts of the metrics that moved, and sets the best-scoring transcripts of
// the first and last logged steps side by side, so a person sees what the reward paid for then and pays for now.
// Runs after the main script (it uses DATA, el, fmt and renderEpisode); run text enters through textContent only.
(function () {
  const found = DATA.shortcut;
  if (!found) return;
  const style = document.createElement("style");
  style.textContent = ".chart.flagged { border: 2px solid var(--orange); } .chart .flag { color: var(--orange); font-size: 12px; }"
    + " .pair { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 14px; }";
  document.head.append(style);
  const CHART_IDS = {stops: "chart-stops", turns: "chart-turns", errors: "chart-errors"};
  const flag = (chart, text) => {
    const box = document.getElementById(CHART_IDS[chart] || "chart-" + chart.replace(/[^A-Za-z0-9_-]/g, "_"));
    if (!box) return;
    box.classList.add("flagged");
    box.append(el("div", {class: "flag", text}));
  };
  for (const move of found.moves) {
    flag(move.chart, `shortcut warning: ${move.label} ${fmt(move.start)} → ${fmt(move.now)}`
      + ` over steps ${found.first_step}–${found.step}`);
  }
  // The probe its replies resemble (runlog/probe_resemblance.py): its probe/<name> chart.
  if (found.probe) flag("probe/" + found.probe.name,
    `shortcut warning: the replies resemble the probe '${found.probe.name}' (${fmt(found.probe.similarity)}) from step ${found.probe.step}`);
  const section = document.getElementById("shortcut");
  section.append(el("h2", {text: "Possible shortcut"}), el("p", {class: "sub", text: `${found.message}. ${found.advice}.`}));
  const examples = DATA.shortcut_examples || {}, pair = el("div", {class: "pair"});
  for (const [name, episode] of [["first", examples.first], ["last", examples.last]]) {
    if (episode) pair.append(el("div", {class: "example-" + name},
      el("h3", {text: `Best-scoring transcript of the ${name} logged step (step ${episode.step})`}), renderEpisode(episode, true)));
  }
  section.append(pair);
})();
