"""Tasks from a file of prompts and answers, trained as TRL trains a dataset: `--rl-env dataset:tasks.jsonl`.

Why: TRL's `GRPOTrainer` takes a `train_dataset` of prompts and reward functions that read its columns;
a user who has such a file should not have to write an environment class to train on it here.

- Rows: the NAME is `rows` as the TRL-factory adapter takes them (env/adapters/common.py `load_rows`): a
  .parquet, .json or .jsonl file, a list of dicts, or `module:function`. A row's `prompt` is a string
  (the user message, after `system_prompt` where one is given) or chat messages, used as they are; every
  other column travels with its row (a `system_prompt` goes first where a prompt has no system message), so `--rl-reward-funcs` functions get them as keyword arguments,
  TRL's way (`def correct(completions, answer, **kwargs)`).
- The model's turn: one per episode.
- Score: the reply's answer against the row's `answer_column`. The answer is what the reply's last
  `<answer>...</answer>` holds, else its last `\\boxed{...}`, else the whole reply; `match` compares:
  `number` (the last number in the answer equals the row's, thousands commas ignored), `exact` (equal
  once case, surrounding spaces and quotes, runs of spaces and a final period are normalised),
  `contains` (the row's answer, normalised, appears in it), `auto` (`number` where the row's answer is a
  number, else `exact`). `match="none"` scores 0 and needs no answer column: the run's reward functions
  score, with `--rl-reward-weights 0,1`. Metrics: `correct` (1 or 0).
- Held back: every `held_out_every`-th row is held back; `split="train"` leaves those out and
  `split="held_out"` plays only them (`--eval-env-config '{"split": "held_out"}'`), `split="all"` (the
  default) plays every row. `num_tasks` keeps the first N rows of the split.
- Oracle: `solve` writes the row's answer, for `env check` and `sft` (a cold model learns to answer in
  the form the score reads).

Left out: multi-turn tasks (write an environment: docs/environments.md), hub dataset names (load them in
a `module:function` rows), and partial credit (write it as a reward function).
"""

from __future__ import annotations

import math
import re
from typing import Any

from aitrain_grpo.env.adapters.common import load_rows
from aitrain_grpo.env.base import Environment, Episode, prompt_messages
from aitrain_grpo.errors import EnvLoadError, one_line

MATCHES = ("auto", "number", "exact", "contains", "none")
SPLITS = ("all", "train", "held_out")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def reply_answer(reply: str) -> str:
    """The answer a reply gives: its last `<answer>` tag's content, else its last `\\boxed{}`, else all of it."""
    for pattern in (_TAGGED, _BOXED):
        found = pattern.findall(reply)
        if found:
            return found[-1]
    return reply


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas dropped), or None."""
    found = _NUMBER.findall(text)
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def normalised(text: Any) -> str:
    """`text` lower-cased, its surrounding spaces and quotes, final period and runs of spaces folded."""
    return " ".join(str(text).strip().strip("\"'`").rstrip(".").split()).lower()


def is_number(text: Any) -> bool:
    return re.fullmatch(r"-?(\d[\d,]*(\.\d+)?|\.\d+)", normalised(text)) is not None


def matches(reply: str, answer: Any, how: str) -> bool:
    """Whether `reply` gives `answer` under `how` (see the module docstring)."""
    given = reply_answer(reply)
    if how == "auto":
        how = "number" if is_number(answer) else "exact"
    if how == "number":
        want, got = last_number(str(answer)), last_number(given)
        return want is not None and got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if how == "contains":
        return normalised(answer) in normalised(given)
    return normalised(given) == normalised(answer)


class DatasetEnv(Environment):
    """A file of prompts and answers as a one-turn environment (see the module docstring)."""

    max_turns = 1
    interface = "dataset of prompts and answers"
    no_oracle: str | None = None  # why there is no solve, where there is none (read by env check and sft)

    def __init__(self, rows: Any, answer_column: str = "answer", match: str = "auto", system_prompt: str | None = None,
                 split: str = "all", held_out_every: int = 10, num_tasks: int | None = None):
        if match not in MATCHES:
            raise EnvLoadError(f"match must be one of {', '.join(MATCHES)}, got {match!r}")
        if split not in SPLITS:
            raise EnvLoadError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if not isinstance(held_out_every, int) or held_out_every < 2:
            raise EnvLoadError(f"held_out_every must be an integer of at least 2, got {held_out_every!r}")
        if num_tasks is not None and (type(num_tasks) is not int or num_tasks < 1):
            raise EnvLoadError(f"num_tasks must be a whole number of at least 1 (the first N rows of the split), got "
                               f"{num_tasks!r}; leave it out for every row")
        loaded = load_rows(rows, "dataset", "a dataset of prompts")
        kept = [row for i, row in enumerate(loaded) if split == "all" or
                (i % held_out_every == held_out_every - 1) == (split == "held_out")]
        self.rows = kept[:num_tasks] if num_tasks is not None else kept
        if not self.rows:
            raise EnvLoadError(f"the dataset's {split} split is empty ({len(loaded)} rows, every {held_out_every}th "
                               f"held back); give more rows, or split='all'")
        if match != "none":
            missing = [i for i, row in enumerate(self.rows) if row.get(answer_column) is None]
            if missing:
                row = self.rows[missing[0]]
                columns = ", ".join(sorted(row))
                lacks = f"has {answer_column!r} empty (null)" if answer_column in row else f"has no {answer_column!r}"
                raise EnvLoadError(f"dataset row {missing[0]} {lacks} (its columns: {one_line(columns, 160)}); "
                                   f"name the answers' column with answer_column, or score with reward functions "
                                   f"alone: match='none' and --rl-reward-funcs")
            self.solve = self._solve  # an oracle only where rows carry answers (env/base.has_solve)
        else:
            self.no_oracle = "the dataset is scored with match='none', so its rows carry no answers to write"
        self.answer_column, self.match, self.system_prompt = answer_column, match, system_prompt

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        built = []
        for row in self.rows:
            prompt = prompt_messages(row["prompt"])
            if self.system_prompt and prompt[0].get("role") != "system":
                prompt = [{"role": "system", "content": self.system_prompt}] + prompt
            built.append({**row, "prompt": prompt})
        return built

    def _solve(self, episode: Episode) -> str:
        return str(episode.row[self.answer_column])

    def score_episode(self, episode: Episode) -> float:
        if self.match == "none":
            return 0.0
        correct = matches(episode.last_completion, episode.row[self.answer_column], self.match)
        episode.metrics["correct"] = float(correct)
        return float(correct)
