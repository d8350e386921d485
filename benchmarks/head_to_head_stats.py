"""The settled comparison of benchmarks/head_to_head.py: held-back success at the budget, aitrain - TRL, with
its 95% interval, and the learning curves from the in-training evaluations (head_to_head_report.py writes
them into HEAD_TO_HEAD.md).

The interval: seeds are paired (seed s of both trainers starts from the same model with the same seed and
is evaluated on the same 128 held-back episodes' tasks and sampling seed), so the difference is taken per
seed, d_s = success_aitrain(s) - success_trl(s), and the interval is a t-interval over those differences:
mean(d) +- t(0.975, n-1) * sd(d) / sqrt(n). Why not a bootstrap over seeds and episodes: with five seeds a
bootstrap over seeds has 126 distinct resamples and its percentile interval is too narrow (it spreads by
sd * sqrt((n-1)/n) and ignores that sd itself is estimated from five values), while the t-interval is
exact for normal differences and wide enough when they are not far from it. Each seed's difference
already carries its episodes' sampling noise (128 episodes a checkpoint: a standard error of about 0.044
at success 0.5), so the spread of the d_s holds both the seed-to-seed and the episode-to-episode variance;
resampling episodes on top would count the latter twice. With one seed there is no spread over seeds:
the interval is then the episodes' alone (Wald, the two trainers' episodes independent), and says so.
"tie" when the interval holds 0, else who is ahead.

Left out: corrections for comparing several budgets or loops (each interval is read on its own), and
unpaired seeds (a seed that one trainer lacks is left out of the difference).
"""

from __future__ import annotations

import math
import statistics

from aitrain_grpo.engine.stats import SUCCESS
from aitrain_grpo.evaluation.paired import t975  # the t quantiles `aitrain eval --baseline` reads too



def count(scores: list[float]) -> tuple[int, int]:
    """(successes, episodes) of one checkpoint's held-back episode scores."""
    return sum(s >= SUCCESS for s in scores), len(scores)


def difference(pairs: dict[int, tuple[tuple[int, int], tuple[int, int]]]) -> dict | None:
    """Success difference aitrain - TRL with its 95% interval; `pairs` maps a seed to (aitrain's (successes,
    episodes), TRL's), each the final checkpoint's held-back episodes (counts, so a seed whose episode files
    are gone but whose counts were recorded still counts). None without a complete pair."""
    pairs = {s: (a, b) for s, (a, b) in pairs.items() if a and b and a[1] and b[1]}
    if not pairs:
        return None
    diffs = [a[0] / a[1] - b[0] / b[1] for a, b in pairs.values()]
    mean = statistics.mean(diffs)
    if len(diffs) >= 2:
        half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        method = f"t-interval over {len(diffs)} paired seeds"
    else:
        (a, b), = pairs.values()
        pa, pb = a[0] / a[1], b[0] / b[1]
        half = 1.96 * math.sqrt(pa * (1 - pa) / a[1] + pb * (1 - pb) / b[1])
        method = f"one seed: episodes only (Wald, {a[1]} + {b[1]} episodes), no seed-to-seed spread"
    low, high = mean - half, mean + half
    verdict = "tie" if low <= 0 <= high else ("aitrain ahead" if low > 0 else "TRL ahead")
    return {"mean": mean, "low": low, "high": high, "seeds": sorted(pairs), "diffs": diffs, "method": method,
            "verdict": verdict}


def describe(result: dict | None, loop: str) -> str:
    if result is None:
        return f"- {loop}: no seed with both trainers' final checkpoints evaluated."
    return (f"- {loop}: aitrain - TRL = **{result['mean']:+.3f}**, 95% interval [{result['low']:+.3f}, "
            f"{result['high']:+.3f}] ({result['method']}; per seed {', '.join(f'{d:+.3f}' for d in result['diffs'])}):"
            f" **{result['verdict']}**.")


def success_figure(series: list[tuple[str, str, list[tuple[float, float]]]], path, style: dict, xlabel: str,
                   ylabel: str) -> bool:
    """Held-back success lines, one per (run name, trainer, points); False without matplotlib or points."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not any(points for _, _, points in series):
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, trainer, points in series:
        if points:
            color, line = style.get(trainer, ("gray", ":"))
            ax.plot(*zip(*points), line, color=color, marker="o", markersize=3, label=name, alpha=0.85)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def curve_figure(rows: list[dict], path, style: dict) -> bool:
    """In-training held-back success against training CPU minutes, every run; False without matplotlib or data."""
    series = [(r["name"], r["trainer"], [(e["train_cpu_s"] / 60, e["success"]) for e in r["ledger"]
                                         if e.get("success") is not None]) for r in rows]
    return success_figure(series, path, style, "CPU minutes of training (model loading included, evaluation left out)",
                          "held-back success (in-training evaluation)")
