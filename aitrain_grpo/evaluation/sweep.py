"""`aitrain eval --model RUN --checkpoints all|last|STEPS`: a run's checkpoints played on the same tasks, so
the weights to keep are chosen on tasks, not on the training reward.

Why: a run's last weights are not always its best (a policy drifts past its peak, or learns a shortcut the
training reward cannot see), and a run trained without `--eval-every` has no held-back curve at all. The
sweep plays a reference (the run's start, its base model; the `--baseline` model when one is given), each
chosen checkpoint, and the run's final weights when no chosen checkpoint already holds them, all on the
same tasks from the same seed, with the environment and settings the run trained with. One table: a row a
model, with its success difference against the reference paired by task (evaluation/paired.py), and a
line naming the best (highest success, then mean score, the earlier step on a tie) with the command that
makes it a model of its own. With `--use-vllm` one engine plays them all when they share their base
weights, each LoRA adapter applied per request (evaluate.py `SharedVLLMEngine`): one engine start, not one
a checkpoint.

Left out: `best/` (with `--save-best` it is a copy of a checkpoint's weights, judged on other episodes);
checkpoints of several runs in one table (evaluate each run, or pass one as `--baseline`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.table import Table

from aitrain_grpo.engine.stats import SUCCESS
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.evaluation.evaluate import EvalResult
from aitrain_grpo.evaluation.paired import PairedDifference, paired_difference
from aitrain_grpo.models.loading import ModelSource, resolve_source


@dataclass(frozen=True)
class SweptModel:
    label: str            # "start", "baseline", "checkpoint-6", "final"
    step: int | None      # training steps behind the weights; None for a baseline from elsewhere
    source: ModelSource


def chosen_steps(which: str, available: list[int], flag: str = "--checkpoints") -> list[int]:
    """`all`, `last`, or comma-separated steps, each of which must be a checkpoint of the run."""
    which = which.strip().lower()
    if which == "all":
        return available
    if which == "last":
        return available[-1:]
    try:
        asked = sorted({int(part) for part in which.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"{flag} {which!r} is not 'all', 'last' or comma-separated steps such as 10,20") from None
    if not asked:
        raise ConfigError(f"{flag} {which!r} names no step; pass all, last, or steps such as 10,20")
    missing = [s for s in asked if s not in available]
    if missing:
        raise ConfigError(f"{flag} {which!r}: the run has no checkpoint at step {', '.join(map(str, missing))}; "
                          f"its checkpoints are at steps {', '.join(map(str, available))}")
    return asked


def swept_models(run: str, which: str, baseline: str | None) -> tuple[dict, list[SweptModel]]:
    """The run's options (run_config.json) and the models to play, the reference first. `last` is the run's
    newest weights: its final model when it trained past its last checkpoint; `all` adds that final model
    after the checkpoints."""
    # training's notion of a complete checkpoint; imported here: it brings TRL, which `aitrain --help` need not load
    from aitrain_grpo.training.run.checkpoints import checkpoint_step, complete_checkpoints

    folder = Path(run).expanduser()
    if not (folder / "run_config.json").is_file():
        raise ConfigError(f"--checkpoints needs a training run's folder as --model; {run} has no run_config.json "
                          f"(pass the --output-dir of a run)")
    run_config = json.loads((folder / "run_config.json").read_text())
    available = [(checkpoint_step(p), p) for p in complete_checkpoints(folder)]
    if not available:
        raise ConfigError(f"{run} holds no complete checkpoint-N folder to sweep; train with --save-steps N, or "
                          f"evaluate its final model without --checkpoints")
    final_step = _final_step(folder)
    has_final = (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()
    final_is_newer = has_final and (final_step is None or final_step > available[-1][0])
    steps = chosen_steps(which, [s for s, _ in available])
    if which.strip().lower() == "last" and final_is_newer:
        steps = []
    checkpoints = [SweptModel(p.name, s, resolve_source(str(p))) for s, p in available if s in steps]
    reference = (SweptModel("baseline", None, resolve_source(baseline)) if baseline else
                 SweptModel("start", 0, start_of(run_config, resolve_source(str(available[0][1])))))
    models = [reference] + checkpoints
    if final_is_newer and which.strip().lower() in ("all", "last"):
        models.append(SweptModel("final", final_step, resolve_source(str(folder))))
    return run_config, models


def start_of(run_config: dict, checkpoint: ModelSource) -> ModelSource:
    """The weights the run started from. A LoRA run's: its adapter's base (where a checkpoint finds it),
    played with the run's tokenizer (its chat template), so that only the weights differ from the
    checkpoints'. A run that trained every weight: its `--model`."""
    if checkpoint.adapter:
        return ModelSource(str(run_config.get("model") or checkpoint.weights), checkpoint.weights, None,
                           checkpoint.tokenizer)
    return resolve_source(str(run_config.get("model") or "tiny"))


def _final_step(folder: Path) -> int | None:
    """The step of the run's final weights (run_summary.json), None when the run wrote no summary."""
    try:
        return int(json.loads((folder / "run_summary.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def best_of(models: list[SweptModel], results: list[EvalResult]) -> int:
    """Index of the best trained model: highest success, then mean score, then the earlier step."""
    summaries = [r.summary() for r in results]
    order = sorted(range(1, len(models)), key=lambda i: (-summaries[i]["success_rate"], -summaries[i]["mean_score"], i))
    return order[0]


def gains(models: list[SweptModel], results: list[EvalResult]) -> list[PairedDifference | None]:
    """Each model's success difference against the reference (the first), paired by task; None for it."""
    reference = list(zip(results[0].tasks, results[0].scores))
    return [None] + [paired_difference("success", list(zip(r.tasks, r.scores)), reference,
                                       value=lambda x: float(x >= SUCCESS)) for r in results[1:]]


def sweep_table(models: list[SweptModel], results: list[EvalResult], *, title: str) -> Table:
    """One row a model: success, its success difference against the reference (the first row) in points,
    mean score, pass@k (with k > 1), turns, truncated episodes ("cut") and tool errors; narrow enough for
    an 80-column terminal."""
    samples = results[0].samples
    versus = f"vs {models[0].label}"
    names = ["model", "success", versus, "score", f"pass@{samples}", "turns", "cut", "tool err"]
    if samples == 1:  # pass@1 is the success rate
        names.remove("pass@1")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for name in names:
        table.add_column(name, justify="left" if name == "model" else "right", no_wrap=True)
    for model, result, gain in zip(models, results, gains(models, results)):
        s = result.summary()
        label = f"final (step {model.step})" if model.label == "final" and model.step is not None else model.label
        cells = {"model": label, "success": f"{s['success_rate']:.1%}",
                 versus: "" if gain is None else f"{gain.mean * 100:+.1f}", "score": f"{s['mean_score']:.3f}",
                 f"pass@{samples}": f"{s[f'pass@{samples}']:.1%}", "turns": f"{s['mean_turns']:.2f}",
                 "cut": str(int(s["truncated"])), "tool err": str(int(s["tool_errors"]))}
        table.add_row(*(cells[name] for name in names))
    return table


def gain_lines(models: list[SweptModel], results: list[EvalResult]) -> list[str]:
    """Under the table: each model's success difference with its 95% interval and what it says."""
    reference = models[0].label
    words = {0: "a tie (the interval holds 0; more --episodes narrow it)", 1: f"ahead of the {reference}",
             -1: f"behind the {reference}"}
    return [f"{model.label}, success - {reference}: {gain.shown(scale=100, unit=' pts')} over {gain.tasks} tasks: "
            f"{words[gain.direction] if gain.low is not None else gain.verdict}"
            for model, gain in zip(models, gains(models, results)) if gain is not None]


def best_line(models: list[SweptModel], results: list[EvalResult]) -> str:
    best = best_of(models, results)
    s = results[best].summary()
    return (f"best of the run on these tasks: {models[best].label} (success {s['success_rate']:.1%}, mean score "
            f"{s['mean_score']:.3f}); make it a model of its own with: aitrain export {models[best].source.spec} "
            f"--to <folder>")
