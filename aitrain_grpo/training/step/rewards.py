"""The step's rewards: every reward function called once on the batch's episodes, as TRL calls them.

The functions are the run's (training/trainer.py `reward_functions`): `episode_score` (the environment's
score, computed while the episode played), then `--rl-reward-funcs` and the judge
(training/rewards/functions.py, training/rewards/judge.py), which read the episodes themselves. Each is called with
TRL's keywords, so a function written for TRL's `GRPOTrainer` runs unchanged: `prompts`, `completions`
(the model's decoded completion, as a chat message where the prompt is a conversation), `completion_ids`,
every dataset column, `episode_score`, `trainer_state`, `log_metric` (a scalar averaged into the step's
metrics) and `log_extra` (accepted; no completions table is kept). Async functions run together on one
event loop. A function returns one number or None (abstain) per episode; None becomes NaN.

Returns the (episodes, functions) matrix of this process's episodes; the caller gathers it.

Left out: reward models (TRL's `reward_funcs` as model ids) and TRL's `environments` keyword (its own
`environment_factory` loop, which this package replaces).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from typing import Any, Callable, Sequence

import torch


def decoded_completions(tokenizer, completion_ids: Sequence[Sequence[int]], conversational: bool) -> list:
    """What TRL hands reward functions as `completions`: the decoded text, as one assistant message
    where the prompt is a conversation."""
    texts = tokenizer.batch_decode([list(ids) for ids in completion_ids], skip_special_tokens=True)
    return [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts


def call_reward_functions(funcs: Sequence[Callable[..., Any]], names: Sequence[str], rows: Sequence[dict[str, Any]],
                          completions: list, completion_ids: Sequence[Sequence[int]], extra: dict[str, list],
                          trainer_state: Any, metrics: dict[str, list[float]] | None = None) -> torch.Tensor:
    """(episodes, functions) rewards of this process's episodes; `rows` are their dataset rows, `extra`
    per-episode fields (the environment's score), `metrics` collects `log_metric` values."""
    count = len(rows)
    logged: dict[str, list[float]] = metrics if metrics is not None else defaultdict(list)
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"} if rows else {}
    kwargs = {**columns, **extra, "trainer_state": trainer_state,
              "log_metric": lambda name, value: logged.setdefault(name, []).append(float(value)),
              "log_extra": lambda column, values: None}
    prompts = [row.get("prompt") for row in rows]
    ids = [list(c) for c in completion_ids]
    out = torch.full((count, len(funcs)), torch.nan, dtype=torch.float32)
    pending = []
    for index, (func, name) in enumerate(zip(funcs, names)):
        result = func(prompts=prompts, completions=completions, completion_ids=ids, **kwargs)
        if inspect.isawaitable(result):
            pending.append((index, name, result))
        else:
            out[:, index] = _values(result, count, name)
    if pending:
        async def gather():
            return await asyncio.gather(*(awaitable for _, _, awaitable in pending))

        for (index, name, _), result in zip(pending, asyncio.run(gather())):
            out[:, index] = _values(result, count, name)
    return out


def _values(result: Any, count: int, name: str) -> torch.Tensor:
    values = [float("nan") if value is None else float(value) for value in result]
    if len(values) != count:
        raise ValueError(f"reward function {name!r} returned {len(values)} rewards for {count} episodes; "
                         f"return one number (or None) per episode")
    return torch.tensor(values, dtype=torch.float32)


__all__ = ["call_reward_functions", "decoded_completions"]
