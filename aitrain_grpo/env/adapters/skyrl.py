"""Environments written for skyrl-gym (0.4.0), run unchanged: `BaseTextEnv` subclasses and registered ids.

What SkyRL's trainer does with one (skyrl_train/generators/skyrl_gym_generator.py, `agent_loop`), and
what this adapter does:

- Instances. SkyRL makes one environment per trajectory with `skyrl_gym.make(env_class,
  env_config=..., extras=...)`: `env_config` is the run config's section for that class (an omegaconf
  `DictConfig`), `extras` the dataset row's columns except `prompt` and `env_class`, with `max_turns`
  (the generator's) added. Here the same, per episode, in `reset`, kept in `episode.state["skyrl_env"]`;
  `env_config` is the adapter's `env_config` dict as a `DictConfig`, `max_turns` the adapter's (also our
  turn cap). `env_class` is a class, `module:Class` or a registered id ("gsm8k"); a row's own
  `env_class` column (an id, or `module:Class`) wins over it, as in SkyRL's datasets, and with one on
  every row `env_class` may be left out.
- `init(prompt)` gets a copy of the row's prompt messages and returns `(prompt, metadata)`: that prompt
  is what the model sees. Ours renders the prompt before `reset`, so a class that overrides `init` has
  it called on a probe instance per row when the rows are read; each episode's `init` must return the
  same prompt, or the episode fails (score 0) with a message saying so. `metadata` is not used (nor
  by SkyRL's generator).
- `step(model_turn_text)` for every model turn, returning `BaseTextEnvStepOutput`: `done` ends the
  episode (its observations are not shown, as the episode is over), otherwise `observations` (chat
  messages: user, tool or system) are the reply. A step that is not done but has no observations is
  the environment's error (ours needs something to answer with). `postprocessed_action` is ignored:
  the model's turn stays as it was generated (SkyRL warns that it breaks token-in/token-out).
- Reward. SkyRL places each step's reward at the end of its turn and its GRPO advantage sums them
  (`compute_grpo_outcome_advantage`: `token_level_rewards.sum(-1)`). So the score is the sum of the
  step rewards, clamped to [0, 1]; each is `episode.metrics["reward_step_<n>"]`, the raw sum
  `reward_total`. `get_metrics()`'s numbers join `episode.metrics` under their own names (SkyRL logs them
  as `environment/<name>`), and `close()` runs once the episode is scored.

Rows: `rows` as for the TRL adapter (a list, a Dataset, `module:function`, or SkyRL's own .parquet
files; env/adapters/common.py). Two columns are added: `_skyrl_prompt` (the prompt as given, what
`init` receives) and `_skyrl_class` (the row's class, by `module:Class` or id).

Left out: SkyRL's `global_step` extra (the adapter cannot see the trainer's step), tool groups as
schemas in the prompt (skyrl-gym tools parse their own tags from the text, so they work unchanged;
nothing is rendered for them), `aggregate_metrics` (ours averages each metric), step-wise training,
and rewards outside [0, 1] (clamped, not rescaled).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

from aitrain_grpo.env.adapters.common import (clamp01, import_object, load_rows, origin, resolve_named,
                                              reward_number, spec_of, without)
from aitrain_grpo.env.base import Environment, EnvReply, Episode
from aitrain_grpo.errors import EnvLoadError, one_line, raised_message

STATE_KEY = "skyrl_env"
REWARDS_KEY = "skyrl_rewards"
PROMPT_COLUMN = "_skyrl_prompt"
CLASS_COLUMN = "_skyrl_class"
OWN_COLUMNS = (PROMPT_COLUMN, CLASS_COLUMN)
NOT_EXTRAS = ("prompt", "env_class", *OWN_COLUMNS)  # SkyRL's extras are the other columns
DEFAULT_MAX_TURNS = 10


def _messages(prompt: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else copy.deepcopy(list(prompt))


class SkyRLEnv(Environment):
    """A skyrl-gym `BaseTextEnv` as a multi-turn `Environment` (see the module docstring)."""

    interface = "skyrl-gym BaseTextEnv"

    def __new__(cls, env_class: Any = None, rows: Any = None, env_config: dict | None = None,
                max_turns: int = DEFAULT_MAX_TURNS):
        # The same parameters as __init__: load_environment checks config keys against this signature.
        return super().__new__(resolve_named(cls, env_class) if cls is SkyRLEnv else cls)

    def __init__(self, env_class: Any = None, rows: Any = None, env_config: dict | None = None,
                 max_turns: int = DEFAULT_MAX_TURNS):
        try:
            importlib.import_module("skyrl_gym")  # registers skyrl-gym's own environments
            from omegaconf import DictConfig
        except ImportError as exc:
            raise EnvLoadError(f"skyrl-gym is not installed ({one_line(exc, 80)}); install it with "
                               f"pip install 'skyrl-gym==0.4.0'") from exc
        if env_config is not None and not isinstance(env_config, dict):
            raise EnvLoadError(f"env_config is a {type(env_config).__name__}; give a dict (SkyRL's "
                               f"environment.skyrl_gym.<env_class> section)")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise EnvLoadError(f"max_turns={max_turns!r}; give a whole number of model turns, at least 1")
        self.env_config, self.max_turns = DictConfig(env_config or {}), max_turns
        self._resolved: dict[str, Any] = {}
        self.default_class = self._resolve(env_class) if env_class is not None else None
        self.name = getattr(env_class, "__name__", None) or str(env_class or "SkyRLEnv")
        self.rows = [self._prepared(i, row) for i, row in enumerate(load_rows(rows, self.name, "skyrl-gym"))]
        self.loaded_from = origin(SkyRLEnv, {"env_class": env_class, "rows": rows, "env_config": env_config,
                                             "max_turns": max_turns})

    # ---------------------------------------------------------------------------------- setup

    def _resolve(self, env_class: Any) -> Any:
        """A class, or a registered id kept as a string (made with `skyrl_gym.make`); names are looked up
        once (episodes resolve their row's class again)."""
        if isinstance(env_class, str):
            resolved = self._resolved.get(env_class)
            if resolved is None:
                resolved = self._resolved[env_class] = self._lookup(env_class)
            return resolved
        return self._lookup(env_class)

    def _lookup(self, env_class: Any) -> Any:
        from skyrl_gym.envs.registration import registry

        if isinstance(env_class, str):
            if env_class in registry:
                return env_class
            if ":" not in env_class:
                raise EnvLoadError(f"env_class {env_class!r} is not a registered skyrl-gym environment "
                                   f"(registered: {', '.join(sorted(registry))}); give one of those, a class, or "
                                   f"'module:Class'")
            env_class = import_object(env_class, "env_class")
        if not inspect.isclass(env_class) or not callable(getattr(env_class, "step", None)) or \
                not callable(getattr(env_class, "init", None)):
            raise EnvLoadError(f"env_class {one_line(repr(env_class), 60)} is not a skyrl-gym environment class; "
                               f"give a BaseTextEnv subclass (with init and step), 'module:Class' or a registered id")
        from skyrl_gym.envs.base_text_env import BaseTextEnv

        if issubclass(env_class, BaseTextEnv) and env_class.step is BaseTextEnv.step:
            raise EnvLoadError(f"{env_class.__name__} does not implement step(self, action) -> "
                               f"BaseTextEnvStepOutput; skyrl-gym's BaseTextEnv.step does nothing")
        return env_class

    def _class_of(self, row: dict[str, Any], index: int | None = None) -> Any:
        """The row's `env_class` column when it has one, else the adapter's (SkyRL's order)."""
        named = row.get("env_class")
        if isinstance(named, str) and named:
            return self._resolve(named)
        if self.default_class is None:
            where = f"row {index}" if index is not None else "the row"
            raise EnvLoadError(f"{where} has no env_class column and no env_class was given; pass env_class= "
                               f"or add an 'env_class' column naming a registered skyrl-gym environment")
        return self.default_class

    def make(self, cls: Any, row: dict[str, Any]) -> Any:
        """One environment for the row, as SkyRL's generator makes it."""
        extras = {key: copy.deepcopy(value) for key, value in row.items() if key not in NOT_EXTRAS}
        extras["max_turns"] = self.max_turns
        config = copy.deepcopy(self.env_config)
        if isinstance(cls, str):
            import skyrl_gym

            return skyrl_gym.make(cls, env_config=config, extras=extras)
        return cls(env_config=config, extras=extras)

    def _init(self, instance: Any, prompt: Any) -> list[dict[str, Any]]:
        result = instance.init(_messages(prompt))
        if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], list):
            raise TypeError(f"init returned {one_line(repr(result), 60)}; return (prompt_messages, metadata)")
        return result[0]

    def _prepared(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        """The row with the prompt `init` makes of it (checked again per episode), and its class."""
        cls = self._class_of(row, index)
        label = cls if isinstance(cls, str) else cls.__name__
        prepared = {**row, PROMPT_COLUMN: row["prompt"], CLASS_COLUMN: cls if isinstance(cls, str) else spec_of(cls)}
        if index > 0 and not _overrides_init(cls):
            return prepared  # init passes the prompt through: nothing to probe past the first row
        try:
            instance = self.make(cls, row)
        except Exception as exc:
            raise EnvLoadError(f"row {index}: {raised_message(f'{label}(env_config, extras)', exc)}; fix the row's "
                               f"columns (they are the extras) or env_config") from exc
        try:
            prepared["prompt"] = self._init(instance, row["prompt"])
        except Exception as exc:
            raise EnvLoadError(f"row {index}: {raised_message(f'{label}.init(prompt)', exc)}; fix init or the "
                               f"row") from exc
        finally:
            _close(instance)
        return prepared

    # ---------------------------------------------------------------------------------- contract

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        return [dict(row) for row in self.rows]

    def reset(self, episode: Episode) -> None:
        row = {**without(episode.row, OWN_COLUMNS), "prompt": episode.row.get(PROMPT_COLUMN, episode.row["prompt"])}
        named = episode.row.get(CLASS_COLUMN)
        cls = self._resolve(named) if isinstance(named, str) else self._class_of(row)
        instance = self.make(cls, row)
        episode.state[STATE_KEY], episode.state[REWARDS_KEY] = instance, []
        prompt = self._init(instance, row["prompt"])
        if _shown(prompt) != _shown(_messages(episode.row["prompt"])):
            raise ValueError(f"init made the prompt {one_line(repr(prompt), 80)}, not the one it made for this row "
                             f"when the rows were read (prompts are made before the episode); make init's "
                             f"prompt depend only on the row")

    def step(self, episode: Episode, completion: str) -> EnvReply:
        output = episode.state[STATE_KEY].step(completion)
        if not isinstance(output, dict) or not {"observations", "reward", "done"} <= set(output):
            raise TypeError(f"returned {one_line(repr(output), 80)}; return BaseTextEnvStepOutput(observations=..., "
                            f"reward=..., done=..., metadata=...)")
        rewards = episode.state[REWARDS_KEY]
        rewards.append(reward_number(output["reward"], "step"))
        episode.metrics[f"reward_step_{len(rewards)}"] = rewards[-1]
        if output["done"]:
            return None
        observations = output["observations"]
        if not observations:
            raise ValueError("returned done=False with no observations; return a message to show the model "
                             "(e.g. [{'role': 'user', 'content': ...}]) or done=True")
        return [dict(message) for message in observations] if isinstance(observations, list) else observations

    def score_episode(self, episode: Episode) -> float:
        instance = episode.state.get(STATE_KEY)
        total = sum(episode.state.get(REWARDS_KEY, []))
        episode.metrics["reward_total"] = total
        if instance is not None:
            try:
                metrics = instance.get_metrics() if callable(getattr(instance, "get_metrics", None)) else {}
            finally:
                _close(instance)
            for key, value in (metrics or {}).items():
                if isinstance(value, (int, float)):  # bools count as 0/1; text and lists are left out
                    episode.metrics[str(key)] = float(value)
        return clamp01(total)


def _overrides_init(cls: Any) -> bool:
    """Whether the class (or a registered id's class) has an `init` of its own."""
    from skyrl_gym.envs.base_text_env import BaseTextEnv
    from skyrl_gym.envs.registration import load_env_creator, registry

    if isinstance(cls, str):
        entry = registry[cls].entry_point
        cls = load_env_creator(entry) if isinstance(entry, str) else entry
    return getattr(cls, "init", None) is not BaseTextEnv.init


def _shown(messages: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """What the model sees of a prompt (a dataset round trip may add keys holding None)."""
    return [(m.get("role"), m.get("content")) for m in messages]


def _close(instance: Any) -> None:
    close = getattr(instance, "close", None)
    if callable(close):
        close()


def adapt_skyrl(env_class: Any = None, **config: Any) -> SkyRLEnv:
    """Wrap a skyrl-gym environment: `adapt_skyrl(MyTextEnv, rows=[...])` or `adapt_skyrl("gsm8k",
    rows="data/train.parquet")`; the keyword arguments are `SkyRLEnv`'s (`rows`, `env_config`, `max_turns`)."""
    return SkyRLEnv(env_class, **config)
