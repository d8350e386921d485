"""Playing the held-back tasks of a training run: what `aitrain eval` does, with the run's own model.

`HeldBackTasks` holds what every evaluation of a run plays: the held-back environment (the training
environment's class with `--eval-env-config` in place of `--rl-env-config`, or `--eval-env-module`/
`--eval-env-class`; always its own instance, never the one training plays), its first `--eval-episodes`
rows, and the episode settings of the run (`EpisodeSettings.from_options(config)`, as `aitrain eval`
takes a run's settings from its run_config.json) with `--eval-temperature` in place of the run's. `play`
hands them to `evaluation/evaluate.py`'s `evaluate`, the function `aitrain eval` calls, with the run's seed
and `evaluate`'s own batch size (`aitrain eval`'s default too): so an evaluation during training plays the
episodes `aitrain eval --model CHECKPOINT --episodes K --rl-num-generations k --seed SEED` plays, and
scores the same (tests/test_eval_during_training.py checks it; a colocated-vLLM run's evaluation, on its own
engine, what `aitrain eval --use-vllm` plays: tests/test_held_back_vllm.py).

Around it, the random state of Python, numpy and torch is kept and put back (`kept_random_state`):
`evaluate` seeds every generator, which would otherwise give each step after an evaluation the same noise.

Several processes: each plays its share of the tasks (every world-size-th row from its rank), and the
episodes' numbers are gathered, so every process gets the whole evaluation's numbers (the same on each,
which `--save-best` decides on). Only a one-process run equals `aitrain eval` episode for episode.

Left out: when to evaluate and what is logged (held_back.py), which backend plays (the caller's), and
sampling parameters other than the temperature (top-k, top-p: the run's, as `aitrain eval` takes them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from typing import Any, Iterator

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.base import GenerationBackend
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.stats import EpisodeSummary
from aitrain_grpo.env.base import Environment, needs_policy
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.env_spec import environment_of
from aitrain_grpo.evaluation.evaluate import EvalResult, evaluate
from aitrain_grpo.option_rules import eval_metrics

# Each logged eval/* metric (option_rules.EVAL_METRICS, in its order) and the `EvalResult.summary()` key it is.
SUMMARY_KEYS = ("mean_score", "success_rate", "pass@{k}", "mean_turns", "tool_errors", "truncated", "errors")


def held_back_environment(config: RunConfig) -> tuple[str, str, Any]:
    """(module, class, keyword arguments) of the environment a run evaluates on."""
    if config.eval_env_module:
        return environment_of(None, config.eval_env_module, config.eval_env_class, config.eval_env_config)
    given = config.eval_env_config is not None
    env_config = config.eval_env_config if given else config.rl_env_config
    return environment_of(config.rl_env, config.rl_env_module, config.rl_env_class, env_config, config.rl_env_weights,
                          option="--eval-env-config" if given else "--rl-env-config")


def load_held_back_environment(config: RunConfig) -> Environment:
    """The environment a run evaluates on, built; a bad `--eval-env-config` is named in its error."""
    option = "--eval-env-config" if config.eval_env_config is not None else "--rl-env-config"
    return load_environment(*held_back_environment(config), option=option)


def held_back_settings(config: RunConfig) -> EpisodeSettings:
    """The run's episode settings, at `--eval-temperature`; an agent environment's endpoint on a port of
    its own (the training engine's may be the fixed `--agent-port`)."""
    settings = EpisodeSettings.from_options(config)
    if config.eval_temperature is not None:
        settings = dataclasses.replace(settings, sampling=dataclasses.replace(settings.sampling,
                                                                              temperature=config.eval_temperature))
    return dataclasses.replace(settings, agent_address=(settings.agent_address[0], 0))


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Put the random state of Python, numpy and torch (CPU and every CUDA device) back as it was."""
    import numpy as np
    import torch

    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
             torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        if saved[3] is not None:
            torch.cuda.set_rng_state_all(saved[3])


class HeldBackTasks:
    """The held-back environment, rows and settings of a run (module docstring); `play` evaluates once."""

    def __init__(self, config: RunConfig):
        self.env: Environment = load_held_back_environment(config)
        self.settings = held_back_settings(config)
        self.episodes = config.eval_episodes
        self.samples = config.eval_num_generations
        self.seed = config.seed
        self.label = config.model
        self.rows: list[dict[str, Any]] | None = None
        self.note: str | None = None  # said once: fewer tasks than asked

    def rows_for(self, tokenizer) -> list[dict[str, Any]]:
        if self.rows is None:
            rows = build_rows(self.env, tokenizer)
            if self.episodes > len(rows):
                self.note = (f"note: --eval-episodes {self.episodes} is more than the {len(rows)} tasks the held-back "
                             f"environment builds; each evaluation plays those {len(rows)}")
            self.rows = rows[:self.episodes]
        return self.rows

    def play(self, backend: GenerationBackend, tokenizer, model, *, rank: int = 0, world: int = 1) -> EvalResult:
        """Evaluate once with `backend` (`model` is the policy an environment that scores with it gets)."""
        rows = self.rows_for(tokenizer)
        if needs_policy(self.env):  # its score_episode takes the model, as in `aitrain eval`
            self.env.use_policy(model, tokenizer)
        share = list(range(rank, len(rows), world))
        with kept_random_state():
            result = evaluate(self.env, backend, tokenizer, [rows[i] for i in share], label=self.label,
                              settings=self.settings, samples=self.samples, seed=self.seed)
        if world == 1:
            return result
        from accelerate.utils import gather_object  # several processes only

        mine = [(share[task], EpisodeSummary.of(episode)) for task, episode in zip(result.tasks, result.episodes)]
        played = sorted(gather_object(mine), key=lambda pair: pair[0])
        return dataclasses.replace(result, episodes=[summary for _, summary in played],
                                   tasks=[task for task, _ in played])

    def metrics(self, result: EvalResult) -> dict[str, float]:
        """The eval/* metrics of one evaluation, named as option_rules.eval_metrics names them."""
        summary = result.summary()
        keys = [key.format(k=self.samples) for key in SUMMARY_KEYS]
        return {name: float(summary[key]) for name, key in zip(eval_metrics(self.samples), keys)}
