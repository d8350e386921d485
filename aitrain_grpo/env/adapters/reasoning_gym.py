"""reasoning-gym task families (reasoning-gym 0.1.25), trained unchanged: `--rl-env reasoning_gym:TASK`.

How reasoning-gym's notions map onto ours:
- Tasks: `reasoning_gym.create_dataset(task, size=, seed=, **config)` makes `size` procedural entries
  (`question`, `answer`, `metadata`); `config` is the family's own options (difficulty, ranges, ...).
- Prompt: the question as the user message, after a system message from reasoning-gym's own
  `SYSTEM_PROMPTS` (`system_prompt="default"`: think, then the answer inside `<answer>...</answer>`;
  `"direct"`, `"simple"`, ... or your own text; None for none).
- The model's turn: one turn per episode; the answer is what reasoning-gym's `extract_answer` takes from
  the last `<answer>...</answer>` of the text.
- Score: the family's `score_answer(answer, entry)`, in [0, 1] already (clamped against surprises); no
  `<answer>` tag scores 0. Metrics: `answered` (a tag was there), `correct` (score 1). `exact=True` scores
  1 or 0 (correct or not): many families give partial credit to a reply that only contains the answer
  (`<answer>1 + 6 = 7</answer>` scores 0.11 on "7"), and GRPO, which divides a group's advantages by their
  spread, pushes that 0.11 as hard as a right answer where nothing in the group is right: a warm-started
  SmolLM2 learned to echo the question in two steps (benchmarks/SIGNAL.md).
- Seeds and splits: one dataset from `seed`; every `held_out_every`-th entry is held back, so
  `split="held_out"` gives entries `split="train"` never shows (the same entries for the same seed).
- Oracle: `solve` writes the entry's stored `answer` in the format the prompt asks for and the score
  reads (`<answer>X</answer>`, after an empty `<think></think>` where the system prompt asks for one,
  as `DeepSeekZero` does), for `env check` and `sft`: demonstrations a cold model learns the format
  from. Families that store no answers (`propositional_logic`, `graph_color`, `boxnet`, `rubiks_cube`,
  `rush_hour`: their `score_answer` checks a reply by itself) have no oracle: no `solve`, and
  `no_oracle` says why, for env check's note and sft's refusal.
Rows carry the entry's index (`rg_index`) and, for transcripts, its answer as text; the entry itself
(its metadata is not always JSON) stays in the environment.

Left out: reasoning-gym's composite datasets with weights (`composite` is a task like any other, its
config passed through) and curricula.
"""

from __future__ import annotations

import difflib
from typing import Any

from aitrain_grpo.env.adapters.common import clamp01
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import EnvLoadError

INSTALL = "pip install 'aitrain-grpo[reasoning-gym]'"
SPLITS = ("train", "held_out")
EXAMPLE = "basic_arithmetic or syllogism"  # families whose entries store answers, for no_oracle's hint


def _reasoning_gym():
    try:
        import reasoning_gym
        import reasoning_gym.utils
    except ImportError:
        raise EnvLoadError(f"reasoning_gym environments need the reasoning-gym package; install it with {INSTALL}") from None
    return reasoning_gym


class ReasoningGymEnv(Environment):
    """One reasoning-gym task family as a one-turn environment (see the module docstring)."""

    max_turns = 1
    interface = "reasoning-gym task"
    no_oracle: str | None = None  # why there is no solve, where there is none (read by env check and sft)

    def __init__(self, task: str, size: int = 200, seed: int = 0, split: str = "train", held_out_every: int = 5,
                 system_prompt: str | None = "default", config: dict[str, Any] | None = None, exact: bool = False):
        rg = _reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if task not in DATASETS:
            close = difflib.get_close_matches(task, list(DATASETS), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"there are {len(DATASETS)}, e.g. basic_arithmetic"
            raise EnvLoadError(f"reasoning-gym has no task {task!r}; {hint}")
        if split not in SPLITS:
            raise EnvLoadError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if type(size) is not int or size < 1:
            raise EnvLoadError(f"size must be a whole number of at least 1 (the entries reasoning-gym makes), got {size!r}")
        if type(held_out_every) is not int or held_out_every < 2:
            raise EnvLoadError(f"held_out_every must be a whole number of at least 2, got {held_out_every!r}")
        if size < held_out_every:
            raise EnvLoadError(f"size {size} is below held_out_every {held_out_every}, so no entry is held back; "
                               f"raise size or lower held_out_every")
        try:
            self.data = rg.create_dataset(task, size=size, seed=seed, **(config or {}))
        except (TypeError, ValueError, AssertionError) as exc:
            raise EnvLoadError(f"reasoning-gym could not make {task!r} with config {config}: {exc}") from None
        prompts = rg.utils.SYSTEM_PROMPTS
        self.system = prompts.get(system_prompt, system_prompt) if system_prompt else None
        self.task, self.split, self.held_out_every, self.exact = task, split, held_out_every, exact
        if self.data[0]["answer"] is None:
            self.no_oracle = (f"reasoning-gym's {task} stores no answers (its score_answer checks a reply by "
                              f"itself); families that do, e.g. {EXAMPLE}, have an oracle")
        else:
            self.solve = self._solve  # an oracle only where the entries carry answers (env/base.has_solve)

    def indexes(self) -> list[int]:
        held_out = self.split == "held_out"
        return [i for i in range(len(self.data)) if (i % self.held_out_every == self.held_out_every - 1) == held_out]

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        rows = []
        for i in self.indexes():
            entry = self.data[i]
            messages = [{"role": "system", "content": self.system}] if self.system else []
            messages.append({"role": "user", "content": entry["question"]})
            rows.append({"prompt": messages, "rg_index": i, "answer": str(entry["answer"])})
        return rows

    def _solve(self, episode: Episode) -> str:
        """The entry's stored answer where the score reads it (see the module doc: Oracle)."""
        answer = self.data[episode.row["rg_index"]]["answer"]
        think = "<think>\n</think>\n" if self.system and "<think>" in self.system else ""
        return f"{think}<answer>{answer}</answer>"

    def score_episode(self, episode: Episode) -> float:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(episode.last_completion)
        episode.metrics["answered"] = float(answer is not None)
        score = 0.0 if answer is None else clamp01(float(self.data.score_answer(answer=answer, entry=self.data[episode.row["rg_index"]])))
        episode.metrics["correct"] = float(score >= 1.0)
        return episode.metrics["correct"] if self.exact else score
