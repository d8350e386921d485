"""`aitrain eval`: the command around evaluation/evaluate.py.

A model is `tiny`, a model directory or hub id, or a training output directory (a full model, or a LoRA
adapter). When the model is a training output directory, its `run_config.json` supplies the environment
and the sampling and budget options it was trained with; flags override them. With a baseline model,
both play the same tasks from the same seed, and the table shows the difference; two lines under it give
the mean score's and the success rate's difference with a 95 % interval paired by task, and say "a tie"
when it holds 0 (evaluation/paired.py). A large shift of
truncations, turns or tool errors (against the baseline, or with none against a training run's first
steps) is named in one warning line: a score gained that way is often a shortcut (runlog/shortcuts.py).

Left out: playing and measuring (evaluation/evaluate.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from aitrain_grpo.commands.options import check_positive
from aitrain_grpo.config import CONTEXT_OPTIONS, RunConfig, check_options
from aitrain_grpo.env_spec import env_specs, environment_of
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.chat import template_kwargs_note
from aitrain_grpo.engine.context import resolve_strategies
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.stats import SUCCESS
from aitrain_grpo.env.base import needs_policy
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.evaluation.evaluate import (
    EvalResult, SharedVLLMEngine, check_not_all_failed, evaluate, open_backend, write_records,
)
from aitrain_grpo.evaluation.paired import paired_difference
from aitrain_grpo.evaluation.sweep import SweptModel, best_line, gain_lines, sweep_table, swept_models
from aitrain_grpo.models.loading import load_for_generation, resolve_source
from aitrain_grpo.option_rules import check_seed
from aitrain_grpo.outputs import check_file_output
from aitrain_grpo.runlog.records import is_episode_records
from aitrain_grpo.runlog.shortcuts import eval_warning

# Sampling and budget flags of `aitrain eval`: not given, a training run's own value is used.
RUN_FLAGS = ("rl_max_new_tokens", "rl_max_turns", "rl_max_completion_length", "rl_temperature", "rl_top_k",
             "rl_top_p", "rl_min_p", "rl_repetition_penalty", "rl_env_timeout", "rl_rollout_schedule", "rl_tool_parser",
             "chat_template_kwargs", *CONTEXT_OPTIONS)


def format_value(name: str, value: float) -> str:
    if name in ("episodes", "tasks", "errors", "truncated", "tool_errors"):
        return str(int(value))
    if name == "tokens_per_second":
        return f"{value:.1f}"
    if name in ("success_rate",) or name.startswith("pass@"):
        return f"{value:.1%}"
    return f"{value:.3f}" if math.isfinite(value) else "-"


def _option(value, run_config: dict[str, Any], name: str):
    """A flag's value, else the training run's, else RunConfig's default."""
    if value is not None:
        return value
    if run_config.get(name) is not None:
        return run_config[name]
    return RunConfig.__dataclass_fields__[name].default


def run_eval(*, model: str, baseline: str | None, spec: str | list[str] | None = None, module: str | None,
             class_name: str | None, env_config: str | None, weights: str | None = None,
             episodes: int, samples: int, use_vllm: bool, output: str | None, options: dict[str, Any], seed: int,
             batch_size: int, console, checkpoints: str | None = None) -> list[EvalResult]:
    """What `aitrain eval` does: resolve models and environment, play, print the table, write JSONL.
    `options` holds the sampling and budget flags (None where not given); `checkpoints` sweeps a run's
    checkpoints (evaluation/sweep.py) against its start or the baseline."""
    check_positive(episodes=episodes, rl_num_generations=samples, batch_size=batch_size)
    check_seed(seed)
    check_options(options)
    swept: list[SweptModel] = []
    if checkpoints is not None:
        run_config, swept = swept_models(model, checkpoints, baseline)
        sources = [m.source for m in swept]
    else:
        sources = [resolve_source(model)] + ([resolve_source(baseline)] if baseline else [])
        run_config = sources[0].run_config
    if output is not None:  # before anything loads: never over a folder, '.', or a file of a run being read
        read = [p for s in sources for p in (s.weights, s.adapter) if p and Path(p).expanduser().is_dir()]
        read += [model] if swept else []  # the swept run's folder, not only its checkpoints
        output = str(check_file_output(output, flag="--output", suffixes=(".jsonl",), reads=read,
                                       written_by=is_episode_records, kind="a file of episodes `aitrain eval` wrote"))
    if not (spec or module or class_name):
        spec, module, class_name = (run_config.get(k) for k in ("rl_env", "rl_env_module", "rl_env_class"))
        env_config = env_config if env_config is not None else run_config.get("rl_env_config")
        weights = weights if weights is not None else run_config.get("rl_env_weights")
        if not (spec or module):
            raise ConfigError(f"no environment given; pass --rl-env-module and --rl-env-class, or --rl-env ({model} "
                              f"has no run_config.json to take them from)")
    env = load_environment(*environment_of(spec, module, class_name, env_config, weights))
    settings = {name: _option(options.get(name), run_config, name) for name in (*RUN_FLAGS, "rl_cut_turn")}
    check_options(settings)  # a training run's values too (its run_config.json may be older)
    played = EpisodeSettings.from_options(settings)  # how both models play their episodes
    resolve_strategies(env, played.context)  # a strategy the environment cannot play, refused before a model loads
    results: list[EvalResult] = []
    rows, said = None, set()
    shared = SharedVLLMEngine.for_sources(sources) if use_vllm else None  # one engine, adapters per request
    for source in sources:
        backend, tokenizer, model_ = shared.open(source) if shared else open_backend(source, use_vllm=use_vllm)
        if needs_policy(env):  # its score_episode takes the model (vLLM: load it in HF too)
            env.use_policy(model_ if model_ is not None else load_for_generation(source)[0], tokenizer)
        note = template_kwargs_note(tokenizer, dict(played.template_kwargs or {}))
        if note and note not in said:  # once, where both models share a template
            said.add(note)
            console.print(note, markup=False)
        if rows is None:  # both models play the same tasks, built once
            rows = build_rows(env, tokenizer)
            if episodes > len(rows):  # said, so that a table of fewer episodes than asked is not a surprise
                console.print(f"note: --episodes {episodes} is more than the {len(rows)} tasks the environment "
                              f"builds; playing those {len(rows)}", markup=False)
            rows = rows[:episodes]
        console.print(f"playing {len(rows)} tasks x {samples} with {source.spec} ...", markup=False)
        results.append(evaluate(env, backend, tokenizer, rows, label=source.spec, settings=played, samples=samples,
                                batch_size=batch_size, seed=seed))
        del backend  # the model's memory goes before the next one loads
    named = " + ".join(env_specs(spec)) if spec else f"{module}.{class_name}"
    if swept:
        console.print(sweep_table(swept, results, title=table_title(named, played.sampling, results[0].schedule)))
        for line in [*gain_lines(swept, results), best_line(swept, results)]:
            console.print(line, markup=False)
        if output:
            console.print(f"episodes written to {write_records(output, results)}", markup=False)
        say_environment_errors(results, console)
        return results
    show_results(results, console, env_name=named, sampling=played.sampling)
    for line in difference_lines(results):  # with a baseline: is the difference more than noise?
        console.print(line, markup=False)
    shift = eval_warning([r.summary() for r in results], model)  # truncations, turns, tool errors moved a lot
    if shift:
        console.print(f"warning: {shift}", markup=False)
    if output:
        console.print(f"episodes written to {write_records(output, results)}", markup=False)
    say_environment_errors(results, console)
    return results


def say_environment_errors(results: list[EvalResult], console) -> None:
    """After the table and the records (which show the errors episode by episode): a note naming the most
    common environment errors, or a refusal when every episode of a model ended in one."""
    for result in results:
        note = check_not_all_failed(result, f"episodes of {result.label}",
                                    "fix the environment (`aitrain env check` plays it and names where it raised)")
        if note:
            console.print(note, markup=False)


def difference_lines(results: list[EvalResult]) -> list[str]:
    """With a baseline, the mean score's and the success rate's difference with their 95 % intervals,
    paired by task (evaluation/paired.py); nothing for one model."""
    if len(results) != 2:
        return []
    played = [list(zip(r.tasks, r.scores)) for r in results]
    score = paired_difference("mean score", *played)
    success = paired_difference("success rate", *played, value=lambda s: float(s >= SUCCESS))
    return [score.line(), success.line(scale=100, unit=" pts")] if score and success else []


def table_title(env_name: str, sampling: SamplingParams, schedule: str) -> str:
    return (f"{env_name}: temperature {sampling.temperature:g}, top-k {sampling.top_k}, top-p {sampling.top_p:g}, "
            f"{schedule} rollouts")


def show_results(results: list[EvalResult], console, *, env_name: str, sampling: SamplingParams) -> None:
    summaries = [r.summary() for r in results]
    table = Table(title=table_title(env_name, sampling, results[0].schedule), title_justify="left")
    table.add_column("metric")
    for result, name in zip(results, ("model", "baseline")):
        table.add_column(f"{name}: {result.label}", justify="right", overflow="fold")
    if len(results) == 2:
        table.add_column("difference", justify="right")
    for key in summaries[0]:
        cells = [format_value(key, s[key]) for s in summaries]
        if len(results) == 2:
            delta = summaries[0][key] - summaries[1][key]
            if key.startswith("pass@") or key == "success_rate":
                cells.append(f"{delta * 100:+.1f} pts")
            elif key in ("episodes", "tasks"):
                cells.append("")
            elif key in ("errors", "truncated", "tool_errors"):
                cells.append(f"{int(delta):+d}")
            else:
                cells.append(f"{delta:+.3f}" if key != "tokens_per_second" else f"{delta:+.1f}")
        table.add_row(key.replace("_", " "), *cells)
    console.print(table)
