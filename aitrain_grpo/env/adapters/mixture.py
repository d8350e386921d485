"""Several environments in one run: `--rl-env A --rl-env B [--rl-env-weights 0.7,0.3]`.

`MixtureEnv` holds one instance of each environment, built exactly as it would be alone (any spec
`--rl-env` takes, each with its own keyword arguments), and plays every episode with the environment
its row came from:
- Dataset: each environment's rows, tagged with its name (`aitrain_env`) and index (`aitrain_row`) and
  mixed in proportion to the weights (default: each environment's rows as many as it built). A row is
  drawn again when its environment's share asks for more rows than it has; the order is shuffled with
  `seed`. Training sees only the prompt and the two tags, so rows of different shapes fit one table;
  `reset` gives the episode its own environment's whole row back (`episode.row`), tag included.
- Turns: `reset`, `step`, `score_episode` and `solve` go to that environment; its `max_turns` caps
  the episode (the mixture's own cap is the largest, for budgets).
- Context: each episode keeps its history by its own environment's strategy (`context_strategy`, or its
  `compact` hook, which `compact` passes on), `--rl-context` over all (engine/context.py `resolve_strategies`),
  so a long-horizon environment can summarize or compact while a short one beside it keeps everything.
- Tools: each row's episodes are offered its environment's tools only (`tools_for_row`), rendered per
  episode by the engine; `tools` is all of them, for display.
- Metrics: the environment's own metrics as `env/<name>/<metric>`, and `env/<name>/score_mean`, so a
  mixture's log says how each environment is doing; `env/score_mean` is over all episodes.

Names are what the spec names (`basic_arithmetic`, `Wordle-v0`, `HotelEnv`), with `-2`, `-3` added to
repeats. Left out: per-environment sampling settings and schedules (curricula that change the weights).
"""

from __future__ import annotations

import random
from typing import Any

from aitrain_grpo.env.base import Environment, Episode, EnvReply, has_compact, has_solve, needs_policy, prompt_messages, tools_for_row
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.errors import EnvLoadError

ENV_COLUMN, ROW_COLUMN = "aitrain_env", "aitrain_row"


def _check_members(envs: Any) -> None:
    if not isinstance(envs, list) or len(envs) < 2 or not all(isinstance(e, dict) and e.get("spec") for e in envs):
        raise EnvLoadError("a mixture takes envs=[{\"spec\": ..., \"config\": {...}}, ...] with two or more "
                           "environments; name them with --rl-env repeated")


class MixtureEnv(Environment):
    """Each episode played by the environment its row came from (see the module docstring)."""

    interface = "a mixture of environments"

    def __init__(self, envs: list[dict[str, Any]], weights: list[float] | None = None, seed: int = 0):
        from aitrain_grpo.env.loading import load_environment  # loading imports the adapters' package
        from aitrain_grpo.env_spec import expand_env_spec, mixture_weights, spec_label

        _check_members(envs)
        self.weights = mixture_weights(weights, len(envs)) or []
        self.seed = seed
        self.members: dict[str, Any] = {}
        for entry in envs:
            name = base = spec_label(entry["spec"])
            count = 1
            while name in self.members:
                count += 1
                name = f"{base}-{count}"
            self.members[name] = load_environment(*expand_env_spec(entry["spec"], entry.get("config")))
        self.max_turns = max(int(getattr(env, "max_turns", 10) or 10) for env in self.members.values())
        self.needs_policy = any(needs_policy(env) for env in self.members.values())
        self._rows: dict[str, list[dict[str, Any]]] = {}
        if all(has_solve(env) for env in self.members.values()):
            self.solve = self._solve  # an oracle only where every environment has one (sft, env check)
        else:  # a member's own reason for having none (reasoning-gym: no stored answers) is the mixture's
            self.no_oracle = next((f"{name}: {env.no_oracle}" for name, env in self.members.items()
                                   if not has_solve(env) and getattr(env, "no_oracle", None)), None)

    # ------------------------------------------------------------------------------- the dataset

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        self._rows = {name: build_rows(env, tokenizer) for name, env in self.members.items()}
        sizes = {name: len(rows) for name, rows in self._rows.items()}
        total = sum(sizes.values())
        shares = self.weights or list(sizes.values())
        counts = {name: round(total * share / sum(shares)) for name, share in zip(sizes, shares)}
        rng = random.Random(self.seed)
        mixed = []
        for name, count in counts.items():
            order = list(range(sizes[name]))
            rng.shuffle(order)
            for k in range(count):
                index = order[k % len(order)]
                mixed.append({"prompt": prompt_messages(self._rows[name][index]["prompt"]),
                              ENV_COLUMN: name, ROW_COLUMN: index})
        rng.shuffle(mixed)
        return mixed

    def member(self, row: dict[str, Any]) -> tuple[str, Any]:
        name = row.get(ENV_COLUMN)
        if name not in self.members:
            raise ValueError(f"row has no environment of this mixture ({ENV_COLUMN}={name!r}); "
                             f"the mixture's are {', '.join(self.members)}")
        return name, self.members[name]

    # ------------------------------------------------------------------------------- episodes

    def reset(self, episode: Episode):
        name, env = self.member(episode.row)
        if self._rows and ROW_COLUMN in episode.row:
            episode.row = {**self._rows[name][episode.row[ROW_COLUMN]], ENV_COLUMN: name}
        cap = int(getattr(env, "max_turns", self.max_turns) or self.max_turns)
        episode.max_turns = min(episode.max_turns or cap, cap)
        return env.reset(episode) if hasattr(env, "reset") else None

    def step(self, episode: Episode, completion: str) -> EnvReply:
        return self.member(episode.row)[1].step(episode, completion)

    def score_episode(self, episode: Episode):
        name, env = self.member(episode.row)
        own = dict(episode.metrics)
        score = env.score_episode(episode)
        if hasattr(score, "__await__"):
            return self._score_later(name, score, own, episode)
        self._name_metrics(name, float(score), own, episode)
        return score

    async def _score_later(self, name: str, pending, own: dict, episode: Episode):
        score = await pending
        self._name_metrics(name, float(score), own, episode)
        return score

    @staticmethod
    def _name_metrics(name: str, score: float, before: dict, episode: Episode) -> None:
        """Prefix the metrics this episode's environment reported with its name, add its score."""
        episode.metrics = {**{k: v for k, v in episode.metrics.items() if k in before},
                           **{f"{name}/{k}": v for k, v in episode.metrics.items() if k not in before},
                           f"{name}/score_mean": score}

    def compact(self, episode: Episode):
        """The episode's own environment's `compact` hook; None (go on unchanged) where it has none. The
        engine calls it only for episodes whose strategy is compact (engine/context.py)."""
        env = self.member(episode.row)[1]
        return env.compact(episode) if has_compact(env) else None

    def _solve(self, episode: Episode):
        return self.member(episode.row)[1].solve(episode)

    # ------------------------------------------------------------------------------- tools and policy

    def tools_for_row(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return tools_for_row(self.member(row)[1], row)

    @property
    def tools(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for env in self.members.values():
            for schema in getattr(env, "tools", None) or []:
                seen.setdefault(str(schema.get("function", schema).get("name")), schema)
        return list(seen.values())

    def use_policy(self, model, tokenizer) -> None:
        for env in self.members.values():
            if needs_policy(env):
                env.use_policy(model, tokenizer)
