"""Rewards beside the environment's score: `--rl-reward-funcs module:func,...` and `--rl-reward-weights`.

`load_reward_funcs` imports each `module:func` the way environments are imported (env/loading.py: from
the current directory, one-line `EnvLoadError`s with a suggestion) and checks that it is callable and
takes `**kwargs` (TRL passes every dataset column and more as keywords); `check_required_arguments`
checks, once the dataset is built, that each required parameter is one that will arrive.

`episode_rewards` wraps each for TRL. The wrapper is named after the attribute (TRL logs it as
`rewards/<name>/mean`) and adds to TRL's arguments:
- `episodes`: the finished `Episode`s of the batch, read from the `TrainingRollout`'s latest batch (the
  rollout returns exactly one episode per completion, in TRL's order);
- `model_tokens`: the tokens the model generated in each episode (environment tokens left out);
- the row's columns and `prompts` taken from the episodes' own rows, so that under
  `--rl-zero-std-groups refill` (where replayed groups replace flat ones) they match the episodes.

A function that raises, or returns something other than one number or None per episode, abstains (None
for the whole batch) rather than stopping the run: the first failure prints a one-line warning naming
it, and `rewards/<name>/error_frac` (share of batches it failed on) shows in the metrics. The
environment's score always counts, so no episode is left without a reward. A function that fails every
batch of 3 in a row stops the run with a checkpoint (rewards/failing.py): training on without it, exit 0,
hid a broken function behind one warning.

Left out: reward models (TRL's `reward_funcs` as model ids: `--rl-reward-model`, rewards/reward_model.py,
wraps its model with `episode_reward`), and `--rl-zero-std-groups` on the weighted total: a group counts as
flat by the environment's score alone.
"""

from __future__ import annotations

import difflib
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from trl.trainer.utils import is_async_callable

from aitrain_grpo.env.loading import import_user_module
from aitrain_grpo.errors import EnvLoadError, describe_exception, user_location
from aitrain_grpo.training.rewards.failing import FAILED_BATCHES, FailureBound

FLAG = "--rl-reward-funcs"
# Keywords every reward function receives (TRL's, then aitrain's); dataset columns come on top.
REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                    "episode_score", "episodes", "model_tokens")


@dataclass(frozen=True)
class RewardFunc:
    """One `module:func` of `--rl-reward-funcs`, imported and checked."""

    spec: str  # as the user wrote it
    name: str  # the attribute name: what TRL logs it under
    func: Callable[..., Any]


def load_reward_funcs(specs: list[tuple[str, str]]) -> list[RewardFunc]:
    """Import and check every function of `--rl-reward-funcs`, as `RunConfig.reward_specs` has parsed it
    (EnvLoadError on the first problem)."""
    loaded = []
    for module, name in specs:
        spec = f"{module}:{name}"
        mod = import_user_module(module, flag=FLAG, what="reward function module")
        if not hasattr(mod, name):
            names = [n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")
                     and not inspect.isclass(v) and not inspect.ismodule(v)]
            best = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            fix = f"did you mean {module}:{best[0]}?" if best else f"functions there: {', '.join(names) or 'none'}"
            raise EnvLoadError(f"module {module!r} ({mod.__file__}) has no reward function {name!r} ({FLAG} "
                               f"{spec}); {fix}")
        func = getattr(mod, name)
        if not callable(func) or inspect.isclass(func):
            kind = "a class" if inspect.isclass(func) else f"{type(func).__name__} {str(func)[:40]!r}"
            raise EnvLoadError(f"{spec} is not a function (it is {kind}); {FLAG} takes functions that return "
                               f"one float per episode")
        _check_signature(spec, name, func)
        loaded.append(RewardFunc(spec, name, func))
    return loaded


def _check_signature(spec: str, name: str, func: Callable) -> None:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: the first call will tell
        return
    example = f"def {name}(completions, episodes, **kwargs)"
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        raise EnvLoadError(f"reward function {spec} does not take **kwargs; it is called with prompts, "
                           f"completions, completion_ids, episodes and every dataset column as keywords: "
                           f"define it as {example}")
    positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        raise EnvLoadError(f"reward function {spec} has positional-only parameter(s) {', '.join(positional)}; "
                           f"every argument arrives by keyword: define it as {example}")


def check_required_arguments(funcs: list[RewardFunc], columns: list[str]) -> None:
    """Each parameter without a default must be a reward argument or a dataset column."""
    known = set(REWARD_ARGUMENTS) | set(columns)
    for reward in funcs:
        try:
            params = inspect.signature(reward.func).parameters.values()
        except (TypeError, ValueError):
            continue
        missing = [p.name for p in params if p.default is p.empty and p.name not in known
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            raise EnvLoadError(f"reward function {reward.spec} requires {', '.join(map(repr, missing))}, which "
                               f"is neither a reward argument ({', '.join(REWARD_ARGUMENTS)}) nor a dataset "
                               f"column ({', '.join(columns)}); rename it or give it a default")


def checked_values(values: Any, count: int) -> list[float | None]:
    """One finite number or None per episode, else ValueError saying what came back."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"returned {type(values).__name__}, not a list of {count} numbers")
    if len(values) != count:
        raise ValueError(f"returned {len(values)} values for {count} episodes")
    out: list[float | None] = []
    for value in values:
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
            raise ValueError(f"returned {type(value).__name__} {str(value)[:40]!r}, not a number or None")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"returned {number}; return None to abstain")
        out.append(number)
    return out


class _Wrapped:
    """What the wrapper does around one call: the arguments in, the values checked, failures counted."""

    def __init__(self, reward: RewardFunc, rollout):
        self.reward = reward
        self.rollout = rollout
        self.failures = 0
        self.failing = FailureBound(f"reward function {reward.spec}", "train without its rewards (it abstains on "
                                    "a batch it fails)", "fix the function")  # failing.py

    def arguments(self, prompts, completions, completion_ids, kwargs: dict[str, Any]) -> dict[str, Any]:
        batch = self.rollout.last_batch
        if batch is None or len(batch.episodes) != len(completions):
            got = "no batch" if batch is None else f"{len(batch.episodes)} episodes"
            raise RuntimeError(f"reward function {self.reward.name}: TRL passed {len(completions)} completions "
                               f"but the rollout's latest batch has {got}")
        episodes = batch.episodes
        columns = {key: [ep.row.get(key) for ep in episodes] for key in episodes[0].row if key != "prompt"}
        return {**kwargs, **columns, "prompts": [ep.row.get("prompt") for ep in episodes],
                "completions": completions, "completion_ids": completion_ids, "episodes": episodes,
                "model_tokens": [sum(trace.env_mask) for trace in batch.traces]}

    def finish(self, outcome: Any, count: int, log_metric: Callable | None) -> list[float | None]:
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            values = checked_values(outcome, count)
            failed = 0.0
        except Exception as exc:
            values, failed = [None] * count, 1.0
            self.failures += 1
            at = user_location(exc) if exc.__traceback__ else None
            error = describe_exception(exc, 200) + (f" (at {at})" if at else "")
            if self.failures == 1:
                print(f"warning: reward function {self.reward.spec} failed: {error}; it abstains for this batch (and "
                      f"any other it fails on, counted in rewards/{self.reward.name}/error_frac; "
                      f"{FAILED_BATCHES} in a row stop the run); fix the function", file=sys.stderr)
        if log_metric is not None:
            log_metric(f"rewards/{self.reward.name}/error_frac", failed)
        self.failing.record(1, int(failed), error if failed else "")  # raises RewardFailing past the bound
        return values


def episode_reward(reward: RewardFunc, rollout) -> Callable[..., Any]:
    """TRL reward function for `reward`, reading episodes from `rollout` (a `TrainingRollout`)."""
    wrapped = _Wrapped(reward, rollout)
    if is_async_callable(reward.func):
        async def call(prompts=None, completions=None, completion_ids=None, **kwargs):
            arguments = wrapped.arguments(prompts, completions, completion_ids, kwargs)
            try:
                outcome = await reward.func(**arguments)
            except Exception as exc:
                outcome = exc
            return wrapped.finish(outcome, len(completions), kwargs.get("log_metric"))
    else:
        def call(prompts=None, completions=None, completion_ids=None, **kwargs):
            arguments = wrapped.arguments(prompts, completions, completion_ids, kwargs)
            try:
                outcome = reward.func(**arguments)
            except Exception as exc:
                outcome = exc
            return wrapped.finish(outcome, len(completions), kwargs.get("log_metric"))
    call.__name__ = call.__qualname__ = reward.name
    call.__doc__ = f"{reward.spec}, given the batch's episodes (training/rewards/functions.py)."
    return call


def episode_rewards(funcs: list[RewardFunc], rollout) -> list[Callable[..., Any]]:
    return [episode_reward(reward, rollout) for reward in funcs]
